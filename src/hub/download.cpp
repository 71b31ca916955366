#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "hub/hub.h"
#include "hub/progress.h"
#include "units/byte_size.h"

namespace strata::hub {

namespace fs = std::filesystem;

namespace {

void say(const PullOptions& options, const std::string& message) {
  if (options.progress == nullptr) return;
  std::fprintf(options.progress, "strata: %s\n", message.c_str());
  std::fflush(options.progress);
}

void init_curl_once() {
  static const CURLcode result = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (result != CURLE_OK) throw std::runtime_error(std::string("libcurl: ") + curl_easy_strerror(result));
}

// The status and headers of the last response a request saw; a redirect's make way for its
// target's.
struct ResponseHead {
  long status = 0;
  std::map<std::string, std::string> headers;  // names in lowercase

  std::string header(const std::string& name) const {
    const auto found = headers.find(name);
    return found == headers.end() ? std::string() : found->second;
  }
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& head = *static_cast<ResponseHead*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {
    head.headers.clear();
    head.status = 0;
    if (const size_t space = line.find(' '); space != std::string_view::npos) {
      std::from_chars(line.data() + space + 1, line.data() + line.size(), head.status);
    }
  } else if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
    head.headers[name] = std::string(value);
  }
  return size * count;
}

// One HTTP request with the options every request shares.
class Request {
 public:
  Request(const std::string& url, const PullOptions& options) : easy_(nullptr, curl_easy_cleanup) {
    init_curl_once();
    easy_.reset(curl_easy_init());
    if (!easy_) throw std::runtime_error("libcurl could not start a request");
    CURL* c = easy_.get();
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_USERAGENT, "strata/0.1.0");
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &head_);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error_);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    // A stalled transfer is broken off, and then resumed, rather than waited on for ever.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    // libcurl leaves this header out when a redirect leads to another host, so the token goes
    // to the hub and never to its CDN.
    if (!options.token.empty()) add_header("Authorization: Bearer " + options.token);
  }
  ~Request() { curl_slist_free_all(headers_); }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  CURL* get() { return easy_.get(); }
  const ResponseHead& head() const { return head_; }

  void add_header(const std::string& header) {
    curl_slist* grown = curl_slist_append(headers_, header.c_str());
    if (grown == nullptr) throw std::bad_alloc();
    headers_ = grown;
  }

  CURLcode perform() {
    curl_easy_setopt(easy_.get(), CURLOPT_HTTPHEADER, headers_);
    error_[0] = '\0';
    return curl_easy_perform(easy_.get());
  }

  std::string why(CURLcode code) const {
    return error_[0] != '\0' ? std::string(error_) : std::string(curl_easy_strerror(code));
  }

 private:
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> easy_;
  curl_slist* headers_ = nullptr;
  ResponseHead head_;
  char error_[CURL_ERROR_SIZE] = {};
};

std::string refusal(const std::string& what, const ResponseHead& head, const PullOptions& options) {
  std::string message = what + ": HTTP " + std::to_string(head.status);
  if (const std::string hub_says = head.header("x-error-message"); !hub_says.empty()) message += " (" + hub_says + ")";
  if (head.status == 401 || head.status == 403) {
    message += options.token.empty() ? "; for a private or gated repo, set HF_TOKEN to a token that may read it"
                                     : "; the token in HF_TOKEN may not read it";
  } else if (head.status == 404) {
    message += "; check the repo and file names";
  }
  return message;
}

std::string repo_name(const ModelRef& ref) { return ref.owner + "/" + ref.repo; }

std::string resolve_url(const PullOptions& options, const ModelRef& ref) {
  std::string url = options.endpoint + "/" + repo_name(ref) + "/resolve/main";
  size_t start = 0;
  while (start <= ref.file.size()) {
    const size_t end = std::min(ref.file.find('/', start), ref.file.size());
    const std::string part = ref.file.substr(start, end - start);
    char* escaped = curl_easy_escape(nullptr, part.c_str(), static_cast<int>(part.size()));
    if (escaped == nullptr) throw std::bad_alloc();
    url += "/" + std::string(escaped);
    curl_free(escaped);
    start = end + 1;
  }
  return url;
}

size_t append_to_string(char* data, size_t size, size_t count, void* user) {
  constexpr size_t kMaxBody = 64 << 20;
  auto& body = *static_cast<std::string*>(user);
  if (body.size() + size * count > kMaxBody) return 0;
  body.append(data, size * count);
  return size * count;
}

std::vector<std::string> list_repo_files(const ModelRef& ref, const PullOptions& options) {
  Request request(options.endpoint + "/api/models/" + repo_name(ref), options);
  std::string body;
  curl_easy_setopt(request.get(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(request.get(), CURLOPT_WRITEFUNCTION, append_to_string);
  curl_easy_setopt(request.get(), CURLOPT_WRITEDATA, &body);
  if (const CURLcode rc = request.perform(); rc != CURLE_OK) {
    throw std::runtime_error("listing " + repo_name(ref) + " at " + options.endpoint + " failed: " + request.why(rc));
  }
  if (request.head().status != 200) throw std::runtime_error(refusal("listing " + repo_name(ref), request.head(), options));
  std::vector<std::string> files;
  try {
    const nlohmann::json repo = nlohmann::json::parse(body);
    for (const nlohmann::json& sibling : repo.at("siblings")) {
      files.push_back(sibling.at("rfilename").get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("the hub's file list of " + repo_name(ref) + " is not what it should be: " + e.what());
  }
  return files;
}

// What the hub says a file is, so that the download can be checked against it.
struct FileFacts {
  uint64_t size = 0;
  std::string sha256;  // lowercase hex; empty when the hub reports none (a file outside LFS)
};

std::string sha256_from_etag(std::string etag) {
  if (etag.starts_with("W/")) etag.erase(0, 2);
  etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
  std::transform(etag.begin(), etag.end(), etag.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool is_sha256 = etag.size() == 64 && std::all_of(etag.begin(), etag.end(), [](unsigned char c) {
                           return std::isxdigit(c) != 0;
                         });
  return is_sha256 ? etag : std::string();
}

// The hub answers a HEAD of an LFS file's resolve URL with a redirect to its CDN that carries
// the file's size and SHA-256 (X-Linked-Size, X-Linked-Etag). Other redirects (a renamed repo,
// a mirror) are followed until those headers or the file itself answer.
FileFacts head_file(std::string url, const PullOptions& options, const std::string& name) {
  for (int hop = 0; hop <= 10; ++hop) {
    Request request(url, options);
    curl_easy_setopt(request.get(), CURLOPT_NOBODY, 1L);
    if (const CURLcode rc = request.perform(); rc != CURLE_OK) {
      throw std::runtime_error("asking " + options.endpoint + " about " + name + " failed: " + request.why(rc));
    }
    const ResponseHead& head = request.head();
    const bool linked = !head.header("x-linked-size").empty();
    if (head.status >= 300 && head.status < 400 && !linked) {
      char* next = nullptr;
      curl_easy_getinfo(request.get(), CURLINFO_REDIRECT_URL, &next);
      if (next == nullptr) throw std::runtime_error(refusal(name, head, options) + " without a Location");
      url = next;
      continue;
    }
    if (!linked && head.status != 200) throw std::runtime_error(refusal(name, head, options));
    FileFacts facts;
    const std::string size = linked ? head.header("x-linked-size") : head.header("content-length");
    const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), facts.size);
    if (size.empty() || ec != std::errc() || end != size.data() + size.size()) {
      throw std::runtime_error("the hub reports no usable size for " + name + " ('" + size + "')");
    }
    facts.sha256 = sha256_from_etag(head.header(linked ? "x-linked-etag" : "etag"));
    return facts;
  }
  throw std::runtime_error("asking about " + name + " led through more than 10 redirects");
}

// A partial download and the SHA-256 of what it holds so far.
class PartialFile {
 public:
  explicit PartialFile(fs::path path)
      : path_(std::move(path)), file_(nullptr, std::fclose), hash_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!hash_) throw std::bad_alloc();
    file_.reset(std::fopen(path_.c_str(), "a+b"));
    if (!file_) throw std::system_error(errno, std::generic_category(), "opening " + path_.string());
    reset_hash();
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, file_.get())) > 0) {
      EVP_DigestUpdate(hash_.get(), buffer, n);
      size_ += n;
    }
    // C requires a seek between reading and writing the same stream.
    if (std::ferror(file_.get()) || std::fseek(file_.get(), 0, SEEK_END) != 0) {
      throw std::system_error(errno, std::generic_category(), "reading " + path_.string());
    }
  }

  const fs::path& path() const { return path_; }
  uint64_t size() const { return size_; }

  void restart() {
    if (std::fflush(file_.get()) != 0 || ::ftruncate(::fileno(file_.get()), 0) != 0) {
      throw std::system_error(errno, std::generic_category(), "truncating " + path_.string());
    }
    reset_hash();
    size_ = 0;
  }

  bool append(const char* data, size_t n) {
    if (std::fwrite(data, 1, n, file_.get()) != n) return false;
    EVP_DigestUpdate(hash_.get(), data, n);
    size_ += n;
    return true;
  }

  bool flush() { return std::fflush(file_.get()) == 0; }

  std::string sha256_hex() const {
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> copy(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (!copy || EVP_MD_CTX_copy_ex(copy.get(), hash_.get()) != 1 || EVP_DigestFinal_ex(copy.get(), digest, &length) != 1) {
      throw std::runtime_error("SHA-256 failed");
    }
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) {
      static const char digits[] = "0123456789abcdef";
      hex += digits[digest[i] >> 4];
      hex += digits[digest[i] & 15];
    }
    return hex;
  }

 private:
  void reset_hash() {
    if (EVP_DigestInit_ex(hash_.get(), EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 failed");
  }

  fs::path path_;
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file_;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> hash_;
  uint64_t size_ = 0;
};

// One process downloads into a repo's folder at a time; another waits for it and then finds
// the file there.
class RepoLock {
 public:
  RepoLock(const fs::path& dir, const PullOptions& options, const std::string& name) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "opening " + dir.string());
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    if (errno != EWOULDBLOCK) fail(dir);
    say(options, "waiting for another strata that downloads into " + dir.string() + " (for " + name + ")");
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) fail(dir);
    }
  }
  ~RepoLock() { ::close(fd_); }
  RepoLock(const RepoLock&) = delete;
  RepoLock& operator=(const RepoLock&) = delete;

 private:
  [[noreturn]] void fail(const fs::path& dir) {
    const int error = errno;
    ::close(fd_);
    throw std::system_error(error, std::generic_category(), "locking " + dir.string());
  }
  int fd_ = -1;
};

std::string kept_note(const fs::path& partial) {
  return "; what arrived is kept in " + partial.string() + ": run the same command again to resume";
}

struct Transfer {
  PartialFile& file;
  Progress& progress;
  const PullOptions& options;
  const ResponseHead& head;
  uint64_t from = 0;
  uint64_t total = 0;
  bool decided = false;
  bool writing = false;
  std::string error;  // why the body was refused; set, the transfer cannot go on
};

// The first bytes of a body settle where they go: after the partial file's end for a 206 that
// starts there, at its start for a 200 (a server that ignores Range sends the whole file).
bool decide(Transfer& t) {
  t.decided = true;
  if (t.head.status == 206) {
    const std::string range = t.head.header("content-range");
    const std::string expected = "bytes " + std::to_string(t.from) + "-";
    if (!range.starts_with(expected)) {
      t.error = "the server answered a request for the bytes from " + std::to_string(t.from) + " with '" + range + "'";
      return false;
    }
  } else if (t.head.status == 200) {
    if (t.from > 0) {
      say(t.options, "the server ignored the request to resume; downloading from the start");
      t.file.restart();
      t.progress.start(0);
    }
  } else {
    return true;
  }
  t.writing = true;
  return true;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (!t.decided && !decide(t)) return 0;
  if (!t.writing) return n;
  if (t.file.size() + n > t.total) {
    t.error = "the server sent more than the " + std::to_string(t.total) + " bytes the hub reports";
    return 0;
  }
  if (!t.file.append(data, n)) {
    t.error = "writing " + t.file.path().string() + " failed: " + std::strerror(errno);
    return 0;
  }
  t.progress.update(t.file.size());
  return n;
}

// One GET of the rest of the file. Returns why it broke off when another attempt may get
// further (a dropped connection, a stall, a server error), or an empty string once the file
// is whole; throws when another attempt would not help.
std::string fetch_rest(const std::string& url, const PullOptions& options, PartialFile& file, Progress& progress,
                       uint64_t total, const std::string& name) {
  Request request(url, options);
  const uint64_t from = file.size();
  if (from > 0) request.add_header("Range: bytes=" + std::to_string(from) + "-");
  Transfer transfer{file, progress, options, request.head()};
  transfer.from = from;
  transfer.total = total;
  curl_easy_setopt(request.get(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(request.get(), CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(request.get(), CURLOPT_WRITEDATA, &transfer);
  progress.start(from);
  const CURLcode rc = request.perform();
  const bool flushed = file.flush();
  progress.break_line();
  if (!transfer.error.empty()) throw std::runtime_error(name + ": " + transfer.error + kept_note(file.path()));
  if (!flushed) throw std::runtime_error("writing " + file.path().string() + " failed: " + std::strerror(errno));
  const long status = request.head().status;
  if (rc != CURLE_OK) return request.why(rc);
  if (status >= 500 || status == 429) return "HTTP " + std::to_string(status);
  if (status != 200 && status != 206) {
    throw std::runtime_error(refusal("downloading " + name, request.head(), options) + kept_note(file.path()));
  }
  if (file.size() < total) return "the response ended early";
  return {};
}

}  // namespace

fs::path pull(const ModelRef& given, const PullOptions& options) {
  ModelRef ref = given;
  if (ref.file.empty()) {
    ref.file = choose_gguf(list_repo_files(ref, options), repo_name(ref));
    say(options, repo_name(ref) + ": taking " + ref.file);
  }
  const fs::path final_path = cached_path(options.cache_dir, ref);
  const auto already_there = [&] {
    if (!fs::is_regular_file(final_path)) return false;
    say(options, ref.name() + " is already downloaded");
    return true;
  };
  if (already_there()) return final_path;
  fs::create_directories(final_path.parent_path());
  const RepoLock lock(options.cache_dir / ref.owner / ref.repo, options, ref.name());
  if (already_there()) return final_path;

  const std::string url = resolve_url(options, ref);
  const FileFacts facts = head_file(url, options, ref.name());
  if (facts.sha256.empty()) say(options, "the hub reports no SHA-256 for " + ref.name() + "; only its size is checked");

  const fs::path partial_path = final_path.string() + ".partial";
  PartialFile file(partial_path);
  // A partial file of the whole size that failed the check before cannot be repaired by
  // resuming: its bad bytes may be anywhere.
  if (file.size() > facts.size || (file.size() == facts.size && !facts.sha256.empty() && file.sha256_hex() != facts.sha256)) {
    say(options, "the partial download " + partial_path.string() + " does not match the hub's file; downloading it anew");
    file.restart();
  }
  Progress progress(options.progress, ref.file, facts.size);
  const std::string total = units::describe_bytes(facts.size);
  if (file.size() == 0) {
    say(options, "downloading " + ref.name() + " (" + total + ") into " + final_path.string());
  } else if (file.size() < facts.size) {
    say(options, "resuming " + ref.name() + " at " + units::describe_bytes(file.size()) + " of " + total);
  }
  for (int attempt = 1; file.size() < facts.size; ++attempt) {
    const std::string broke = fetch_rest(url, options, file, progress, facts.size, ref.name());
    if (broke.empty()) break;
    const std::string where = units::describe_bytes(file.size()) + " of " + total + " (" + broke + ")";
    if (attempt >= options.attempts) {
      throw std::runtime_error("downloading " + ref.name() + " stopped at " + where + kept_note(partial_path));
    }
    say(options, "the download stopped at " + where + "; resuming in " + std::to_string(attempt) + " s");
    std::this_thread::sleep_for(std::chrono::seconds(attempt));
  }
  progress.finish(file.size());

  if (!facts.sha256.empty()) {
    if (const std::string got = file.sha256_hex(); got != facts.sha256) {
      throw std::runtime_error("refusing " + ref.name() + ": its SHA-256 is " + got + " but the hub reports " +
                               facts.sha256 + "; the download is kept in " + partial_path.string() +
                               " for a retry, which downloads it anew if it still does not match");
    }
  }
  fs::rename(partial_path, final_path);
  return final_path;
}

}  // namespace strata::hub
