#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "hub/hub.h"

namespace strata::hub {

namespace fs = std::filesystem;

namespace {

// The hub's own rule for owner and repo names, minus its length limit.
bool valid_name(std::string_view s) {
  if (s.empty() || s.front() == '.' || s.front() == '-' || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.';
  });
}

bool ends_with_ci(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), s.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b)); });
}

bool contains_ci(std::string_view s, std::string_view part) {
  return std::search(s.begin(), s.end(), part.begin(), part.end(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         }) != s.end();
}

// A file name becomes a path under the cache, so it may not climb out of it.
void check_file_name(std::string_view file, std::string_view whole) {
  const auto refuse = [&](const char* why) {
    throw std::invalid_argument("'" + std::string(whole) + "': the file name " + why);
  };
  if (file.empty()) refuse("after ':' is empty");
  if (file.front() == '/') refuse("must be relative to the repo");
  size_t start = 0;
  while (start <= file.size()) {
    const size_t end = std::min(file.find('/', start), file.size());
    const std::string_view part = file.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") refuse("has an empty, '.' or '..' component");
    start = end + 1;
  }
}

std::string getenv_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

std::string ModelRef::name() const { return owner + "/" + repo + (file.empty() ? "" : ":" + file); }

std::optional<ModelRef> parse_model_ref(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view repo_part = text.substr(0, colon);
  const size_t slash = repo_part.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  ModelRef ref;
  ref.owner = std::string(repo_part.substr(0, slash));
  ref.repo = std::string(repo_part.substr(slash + 1));
  if (!valid_name(ref.owner) || !valid_name(ref.repo) || ends_with_ci(ref.repo, ".gguf")) return std::nullopt;
  if (colon != std::string_view::npos) {
    ref.file = std::string(text.substr(colon + 1));
    check_file_name(ref.file, text);
  }
  return ref;
}

fs::path default_cache_dir() {
  if (const std::string dir = getenv_or_empty("STRATA_CACHE"); !dir.empty()) return dir;
  if (const std::string xdg = getenv_or_empty("XDG_CACHE_HOME"); !xdg.empty()) return fs::path(xdg) / "strata";
  if (const std::string home = getenv_or_empty("HOME"); !home.empty()) return fs::path(home) / ".cache" / "strata";
  return fs::temp_directory_path() / "strata";
}

fs::path cached_path(const fs::path& cache_dir, const ModelRef& ref) {
  if (ref.file.empty()) throw std::logic_error("cached_path needs a file name");
  return cache_dir / ref.owner / ref.repo / ref.file;
}

std::string choose_gguf(const std::vector<std::string>& repo_files, const std::string& repo_name) {
  std::vector<std::string> ggufs;
  std::copy_if(repo_files.begin(), repo_files.end(), std::back_inserter(ggufs),
               [](const std::string& f) { return ends_with_ci(f, ".gguf"); });
  if (ggufs.empty()) throw std::runtime_error(repo_name + " has no .gguf file");
  if (ggufs.size() == 1) return ggufs.front();
  std::vector<std::string> preferred;
  std::copy_if(ggufs.begin(), ggufs.end(), std::back_inserter(preferred),
               [](const std::string& f) { return contains_ci(f, "Q4_K_M"); });
  if (preferred.size() == 1) return preferred.front();
  std::sort(ggufs.begin(), ggufs.end());
  std::string list;
  for (const std::string& f : ggufs) list += (list.empty() ? "" : ", ") + f;
  throw std::runtime_error(repo_name + " has " + std::to_string(ggufs.size()) + " .gguf files and " +
                           (preferred.empty() ? "no" : std::to_string(preferred.size())) +
                           " Q4_K_M one" + (preferred.size() > 1 ? "s" : "") + "; name one as " + repo_name +
                           ":FILE: " + list);
}

PullOptions options_from_environment() {
  PullOptions options;
  if (std::string endpoint = getenv_or_empty("HF_ENDPOINT"); !endpoint.empty()) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    options.endpoint = endpoint;
  }
  options.token = getenv_or_empty("HF_TOKEN");
  return options;
}

std::optional<fs::path> find_cached(const fs::path& cache_dir, const ModelRef& ref) {
  std::error_code ec;
  if (!ref.file.empty()) {
    const fs::path path = cached_path(cache_dir, ref);
    return fs::is_regular_file(path, ec) ? std::optional<fs::path>(path) : std::nullopt;
  }
  const fs::path dir = cache_dir / ref.owner / ref.repo;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  std::optional<fs::path> found;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec) || !ends_with_ci(entry.path().filename().string(), ".gguf")) continue;
    if (found) return std::nullopt;
    found = entry.path();
  }
  return found;
}

}  // namespace strata::hub
