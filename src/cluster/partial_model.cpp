#include "cluster/partial_model.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cluster/model_footprint.h"
#include "model/config.h"
#include "rpc/auth.h"
#include "rpc/cluster_messages.h"
#include "rpc/messages.h"

namespace strata::cluster {
namespace {

namespace fs = std::filesystem;

constexpr const char* kVerifiedFile = "verified";
constexpr const char* kProgressFile = "progress";

// The file is named after the model, as the API names a model by its file, but only with
// characters that cannot leave the directory: the name comes from a peer.
std::string model_file_name(const cluster_types::ModelManifest& manifest) {
  std::string name = manifest.model_name.substr(0, 128);
  const bool safe = !name.empty() && name[0] != '.' && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
  return (safe ? name : "model") + ".gguf";
}

std::string hex(const Sha256& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::string hex(std::string_view bytes) {
  Sha256 digest{};
  std::memcpy(digest.data(), bytes.data(), std::min(bytes.size(), digest.size()));
  return hex(digest);
}

[[noreturn]] void fail_io(const std::string& what, const std::string& path) {
  throw std::runtime_error("cannot " + what + " " + path + ": " + std::strerror(errno));
}

void write_all(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("write", path);
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// One write of a short line to a file opened for appending: lines of concurrent writers never
// interleave.
void append_line(int fd, const std::string& line, const std::string& path) {
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) fail_io("append to", path);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A list beside the model file written anew with `lines`, the ones that count, so that appending
// never continues a line a crash cut short; returns it opened for appending.
int rewrite_for_appending(const fs::path& path, const std::string& lines) {
  const fs::path fresh = path.string() + ".partial";
  {
    std::ofstream out(fresh, std::ios::binary | std::ios::trunc);
    if (!(out << lines << std::flush)) throw std::runtime_error("cannot write " + fresh.string());
  }
  fs::rename(fresh, path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail_io("open", path.string());
  return fd;
}

// Calls `record(index, rest)` for every line "INDEX REST" of a list beside the model file that is
// whole (ends in a newline: a line cut short by a crash does not) and names one of `count` tensors.
template <typename Record>
void for_each_record(std::string_view text, size_t count, const Record& record) {
  size_t begin = 0;
  while (true) {
    const size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) break;  // no newline: cut short, or nothing left
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) continue;
    size_t index = 0;
    const auto [digits_end, error] = std::from_chars(line.data(), line.data() + space, index);
    if (error != std::errc{} || digits_end != line.data() + space || index >= count) continue;
    record(index, line.substr(space + 1));
  }
}

// The model's directory written anew: a file of the manifest's size holding its header, and
// no tensor verified. Written beside and renamed, so that a crash leaves either no file or
// a whole one.
void create_model_file(const fs::path& dir, const cluster_types::ModelManifest& manifest) {
  const fs::path path = dir / model_file_name(manifest);
  const fs::path partial = path.string() + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io("create", partial.string());
  const auto& header = manifest.header;
  try {
    write_all(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 0, partial.string());
    // The tensor data is a hole until tensors come: the file takes the disk space of what it holds.
    if (::ftruncate(fd, static_cast<off_t>(manifest.file_size)) != 0) fail_io("size", partial.string());
    if (::fsync(fd) != 0) fail_io("sync", partial.string());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  fs::remove(dir / kVerifiedFile);
  fs::remove(dir / kProgressFile);
  fs::rename(partial, path);
}

bool holds_header(const fs::path& path, const cluster_types::ModelManifest& manifest) {
  std::error_code error;
  if (fs::file_size(path, error) != manifest.file_size || error) return false;
  std::ifstream in(path, std::ios::binary);
  std::string header(manifest.header.size(), '\0');
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  return in && header == manifest.header;
}

}  // namespace

std::vector<bool> parse_verified(std::string_view text, const cluster_types::ModelManifest& manifest) {
  std::vector<bool> held(manifest.tensor_sha256.size(), false);
  for_each_record(text, held.size(), [&](size_t index, std::string_view hash) {
    if (hash == hex(manifest.tensor_sha256[index])) held[index] = true;
  });
  return held;
}

std::vector<uint64_t> parse_progress(std::string_view text, std::span<const uint64_t> tensor_bytes) {
  std::vector<uint64_t> progress(tensor_bytes.size(), 0);
  for_each_record(text, progress.size(), [&](size_t index, std::string_view number) {
    uint64_t bytes = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), bytes);
    // The last line counts: a tensor whose bytes did not match is recorded again at 0.
    if (error == std::errc{} && end == number.data() + number.size() && bytes <= tensor_bytes[index]) {
      progress[index] = bytes;
    }
  });
  return progress;
}

std::shared_ptr<PartialModel> PartialModel::open(const std::string& cache_dir, cluster_types::ModelManifest manifest,
                                                 uint64_t checkpoint_bytes) {
  // The protocol's rules for a manifest (32-byte hashes, a header within the file) hold for one
  // from anywhere: the writers rely on them.
  if (const std::string why = rpc::malformed(rpc::to_message(manifest)); !why.empty()) throw std::runtime_error(why);
  const auto& header = manifest.header;
  if (rpc::sha256_hex({reinterpret_cast<const uint8_t*>(header.data()), header.size()}) != manifest.model_hash) {
    throw std::runtime_error("the manifest's header does not have the model's hash " + manifest.model_hash);
  }
  const fs::path dir = fs::path(cache_dir) / "models" / manifest.model_hash;
  fs::create_directories(dir);
  const fs::path path = dir / model_file_name(manifest);
  if (!holds_header(path, manifest)) create_model_file(dir, manifest);

  std::shared_ptr<PartialModel> model(new PartialModel());
  model->dir_ = dir.string();
  model->path_ = path.string();
  model->file_ = gguf::File::open(path.string());
  const gguf::File& file = *model->file_;
  if (file.header_bytes().size() != header.size() ||
      file.tensors().size() != manifest.tensor_sha256.size()) {
    throw std::runtime_error("the manifest's header and tensor hashes do not describe one file (" +
                             std::to_string(file.tensors().size()) + " tensors, " +
                             std::to_string(manifest.tensor_sha256.size()) + " hashes)");
  }
  std::vector<uint64_t> tensor_bytes;
  for (const gguf::TensorInfo& t : file.tensors()) tensor_bytes.push_back(t.size_bytes);
  model->held_ = parse_verified(read_text(dir / kVerifiedFile), manifest);
  model->progress_ = parse_progress(read_text(dir / kProgressFile), tensor_bytes);
  model->manifest_ = std::move(manifest);
  model->checkpoint_bytes_ = checkpoint_bytes;
  std::string verified, progress;
  for (size_t i = 0; i < model->held_.size(); ++i) {
    if (model->held_[i]) {
      verified += std::to_string(i) + ' ' + hex(model->manifest_.tensor_sha256[i]) + '\n';
      model->progress_[i] = 0;
    } else if (model->progress_[i] > 0) {
      progress += std::to_string(i) + ' ' + std::to_string(model->progress_[i]) + '\n';
    }
  }
  model->fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (model->fd_ < 0) fail_io("open", path.string());
  model->verified_fd_ = rewrite_for_appending(dir / kVerifiedFile, verified);
  model->progress_fd_ = rewrite_for_appending(dir / kProgressFile, progress);
  return model;
}

PartialModel::~PartialModel() {
  if (fd_ >= 0) ::close(fd_);
  if (verified_fd_ >= 0) ::close(verified_fd_);
  if (progress_fd_ >= 0) ::close(progress_fd_);
}

bool PartialModel::holds(size_t tensor) const {
  std::lock_guard lock(mutex_);
  return tensor < held_.size() && held_[tensor];
}

uint64_t PartialModel::held_bytes(size_t tensor) const {
  std::lock_guard lock(mutex_);
  if (tensor >= held_.size()) return 0;
  return held_[tensor] ? file_->tensors()[tensor].size_bytes : progress_[tensor];
}

bool PartialModel::complete() const {
  std::lock_guard lock(mutex_);
  return std::all_of(held_.begin(), held_.end(), [](bool h) { return h; });
}

cluster_types::Weights PartialModel::held() const {
  std::lock_guard lock(mutex_);
  if (held_weights_) return *held_weights_;
  const model::Config config = model::Config::from_gguf(*file_);
  const int layer_count = config.layer_count;
  cluster_types::Weights weights;
  std::vector<uint64_t> layers(static_cast<size_t>(layer_count), 0);
  bool embedding = false, output = false, output_norm = false, shared = true;
  const bool tied_head = file_->find_tensor("output.weight") == nullptr;
  for (size_t i = 0; i < held_.size(); ++i) {
    const gguf::TensorInfo& t = file_->tensors()[i];
    const TensorRole role = role_of_tensor(t.name, layer_count, config.skipped_layer_count);
    if (role.kind == TensorRole::Shared) shared = shared && held_[i];
    if (!held_[i]) continue;
    switch (role.kind) {
      case TensorRole::Layer:
        layers[static_cast<size_t>(role.layer)] += t.size_bytes;
        break;
      case TensorRole::Embedding:
        embedding = true;
        break;
      case TensorRole::OutputMatrix:
        output = true;
        break;
      case TensorRole::OutputNorm:
        output_norm = true;
        break;
      case TensorRole::Shared:
      case TensorRole::Unused:
        break;
    }
  }
  weights.whole_file = std::all_of(held_.begin(), held_.end(), [](bool h) { return h; });
  weights.layer_bytes = std::move(layers);
  weights.embedding = embedding;
  weights.head = output_norm && (tied_head ? embedding : output);
  weights.shared = shared;
  held_weights_ = weights;
  return weights;
}

void PartialModel::record_progress(size_t tensor, uint64_t bytes) {
  // The record claims only bytes that reached the disk before it was written.
  if (bytes > 0 && ::fdatasync(fd_) != 0) fail_io("sync", path_);
  std::lock_guard lock(mutex_);
  append_line(progress_fd_, std::to_string(tensor) + " " + std::to_string(bytes) + "\n", dir_ + "/" + kProgressFile);
  progress_[tensor] = bytes;
}

PartialModel::Writer::Writer(PartialModel& model, size_t tensor)
    : model_(model),
      tensor_(tensor),
      hash_(EVP_MD_CTX_new(), [](void* c) { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(c)); }) {
  if (tensor >= model.held_.size()) throw std::runtime_error("no tensor " + std::to_string(tensor) + " in the model");
  start_hash();
  {
    std::lock_guard lock(model.mutex_);
    written_ = checkpointed_ = model.progress_[tensor];
  }
  // Reading back what is on disk costs far less than fetching it again; commit() finds out
  // when it is not what was written.
  const gguf::TensorInfo& t = model.file_->tensors()[tensor];
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(hash_.get()), model.file_->tensor_data(t), written_);
}

void PartialModel::Writer::start_hash() {
  if (!hash_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(hash_.get()), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("cannot start a SHA-256");
  }
}

void PartialModel::Writer::write(uint64_t offset, std::span<const uint8_t> bytes) {
  const gguf::TensorInfo& t = model_.file_->tensors()[tensor_];
  if (offset != written_ || bytes.size() > t.size_bytes - written_) {
    throw std::runtime_error("tensor " + t.name + ": bytes at " + std::to_string(offset) + " (+" +
                             std::to_string(bytes.size()) + ") do not follow the " + std::to_string(written_) +
                             " written, within its " + std::to_string(t.size_bytes));
  }
  const uint64_t at = model_.file_->header_bytes().size() + t.offset + offset;
  write_all(model_.fd_, bytes.data(), bytes.size(), at, model_.path_);
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(hash_.get()), bytes.data(), bytes.size());
  written_ += bytes.size();
  if (written_ - checkpointed_ >= model_.checkpoint_bytes_) checkpoint();
}

void PartialModel::Writer::checkpoint() {
  if (written_ == checkpointed_) return;
  model_.record_progress(tensor_, written_);
  checkpointed_ = written_;
}

void PartialModel::Writer::commit() {
  const gguf::TensorInfo& t = model_.file_->tensors()[tensor_];
  if (written_ != t.size_bytes) {
    throw std::runtime_error("tensor " + t.name + ": " + std::to_string(written_) + " of its " +
                             std::to_string(t.size_bytes) + " bytes came");
  }
  Sha256 digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(hash_.get()), digest.data(), &length);
  const std::string& expected = model_.manifest_.tensor_sha256[tensor_];
  if (std::memcmp(digest.data(), expected.data(), digest.size()) != 0) {
    // The bad bytes may be ones on disk before this writer began: it starts over at byte 0.
    written_ = 0;
    start_hash();
    if (checkpointed_ > 0) {
      model_.record_progress(tensor_, 0);
      checkpointed_ = 0;
    }
    throw std::runtime_error("tensor " + t.name + ": its bytes do not match the manifest's SHA-256");
  }
  if (::fdatasync(model_.fd_) != 0) fail_io("sync", model_.path_);
  std::lock_guard lock(model_.mutex_);
  append_line(model_.verified_fd_, std::to_string(tensor_) + " " + hex(digest) + "\n",
              model_.dir_ + "/" + kVerifiedFile);
  model_.held_[tensor_] = true;
  model_.held_weights_.reset();
  model_.progress_[tensor_] = 0;
}

}  // namespace strata::cluster
