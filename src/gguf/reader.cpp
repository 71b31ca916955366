#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::gguf {
namespace {

// Limits that no real model file comes near; they keep a hostile file from making us
// allocate unbounded memory before the truncation would be noticed.
constexpr uint64_t kMaxStringBytes = 64ull << 20;
constexpr uint64_t kMaxArrayItems = 64ull << 20;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayNesting = 4;

// Bounds-checked sequential reader over the mapped bytes.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(const char* what) {
    if (remaining() < sizeof(T)) {
      throw Error(std::string("truncated file: ran out of bytes reading ") + what +
                  " at offset " + std::to_string(pos_));
    }
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(const char* what) {
    const uint64_t length = read<uint64_t>(what);
    if (length > kMaxStringBytes) {
      throw Error(std::string(what) + ": string length " + std::to_string(length) +
                  " at offset " + std::to_string(pos_ - 8) + " is implausible");
    }
    if (remaining() < length) {
      throw Error(std::string("truncated file: string ") + what + " of " +
                  std::to_string(length) + " bytes runs past the end");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Value read_value(Cursor& cur, ValueType type, const std::string& key, int depth);

ValueType read_value_type(Cursor& cur, const std::string& key) {
  const uint32_t raw = cur.read<uint32_t>("value type");
  if (raw > static_cast<uint32_t>(ValueType::Float64)) {
    throw Error("metadata key '" + key + "' has unknown value type " + std::to_string(raw));
  }
  return static_cast<ValueType>(raw);
}

Value read_value(Cursor& cur, ValueType type, const std::string& key, int depth) {
  switch (type) {
    case ValueType::UInt8: return {type, uint64_t{cur.read<uint8_t>(key.c_str())}};
    case ValueType::Int8: return {type, int64_t{cur.read<int8_t>(key.c_str())}};
    case ValueType::UInt16: return {type, uint64_t{cur.read<uint16_t>(key.c_str())}};
    case ValueType::Int16: return {type, int64_t{cur.read<int16_t>(key.c_str())}};
    case ValueType::UInt32: return {type, uint64_t{cur.read<uint32_t>(key.c_str())}};
    case ValueType::Int32: return {type, int64_t{cur.read<int32_t>(key.c_str())}};
    case ValueType::UInt64: return {type, cur.read<uint64_t>(key.c_str())};
    case ValueType::Int64: return {type, cur.read<int64_t>(key.c_str())};
    case ValueType::Float32: return {type, double{cur.read<float>(key.c_str())}};
    case ValueType::Float64: return {type, cur.read<double>(key.c_str())};
    case ValueType::Bool: {
      const uint8_t b = cur.read<uint8_t>(key.c_str());
      if (b > 1) throw Error("metadata key '" + key + "': bool value " + std::to_string(b));
      return {type, b == 1};
    }
    case ValueType::String: return {type, cur.read_string(key.c_str())};
    case ValueType::Array: {
      if (depth >= kMaxArrayNesting) {
        throw Error("metadata key '" + key + "': arrays nested too deeply");
      }
      Array array;
      array.element_type = read_value_type(cur, key);
      const uint64_t count = cur.read<uint64_t>(key.c_str());
      // Every element takes at least one byte, so a count beyond the remaining bytes is a lie.
      if (count > kMaxArrayItems || count > cur.remaining()) {
        throw Error("metadata key '" + key + "': array length " + std::to_string(count) +
                    " exceeds what the file can hold");
      }
      array.items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        array.items.push_back(read_value(cur, array.element_type, key, depth + 1));
      }
      return {type, std::move(array)};
    }
  }
  throw Error("metadata key '" + key + "': unknown value type");
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("'" + path + "' is not a regular file");
  }
  std::unique_ptr<File> file(new File());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ == 0) {
    ::close(fd);
    throw Error("'" + path + "' is empty, not a GGUF file");
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw Error("cannot map '" + path + "': " + std::strerror(errno));
  file->map_ = static_cast<const uint8_t*>(map);
  try {
    file->parse();
  } catch (const Error& e) {
    throw Error("'" + path + "': " + e.what());
  }
  return file;
}

void File::release_pages(const uint8_t* begin, uint64_t bytes) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  // Advice only: if the kernel declines, the pages simply stay resident.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

File::~File() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

void File::parse() {
  Cursor cur(map_, size_);
  const uint32_t magic = cur.read<uint32_t>("magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0) throw Error("not a GGUF file (bad magic)");
  version_ = cur.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    throw Error("unsupported GGUF version " + std::to_string(version_) + " (need 2 or 3)");
  }
  const uint64_t tensor_count = cur.read<uint64_t>("tensor count");
  const uint64_t kv_count = cur.read<uint64_t>("metadata count");
  // Each key/value takes at least 12 bytes and each tensor info at least 24.
  if (kv_count > cur.remaining() / 12) {
    throw Error("metadata count " + std::to_string(kv_count) + " exceeds what the file can hold");
  }
  if (tensor_count > cur.remaining() / 24) {
    throw Error("tensor count " + std::to_string(tensor_count) + " exceeds what the file can hold");
  }

  std::unordered_set<std::string> keys;
  metadata_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = cur.read_string("metadata key");
    if (key.empty()) throw Error("metadata entry " + std::to_string(i) + " has an empty key");
    if (!keys.insert(key).second) throw Error("duplicate metadata key '" + key + "'");
    const ValueType type = read_value_type(cur, key);
    Value value = read_value(cur, type, key, 0);
    metadata_.push_back({std::move(key), std::move(value)});
  }

  if (const Value* a = find("general.alignment")) {
    const auto v = a->as_uint();
    if (!v || *v == 0 || (*v & (*v - 1)) != 0 || *v > 65536) {
      throw Error("general.alignment must be a power of two up to 65536");
    }
    alignment_ = *v;
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.name = cur.read_string("tensor name");
    if (t.name.empty()) throw Error("tensor " + std::to_string(i) + " has an empty name");
    if (!names.insert(t.name).second) throw Error("duplicate tensor name '" + t.name + "'");
    const uint32_t n_dims = cur.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) {
      throw Error("tensor '" + t.name + "' has " + std::to_string(n_dims) +
                  " dimensions (1 to 4 allowed)");
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = cur.read<uint64_t>("tensor dimension");
      if (dim == 0 || dim > (1ull << 40) || !checked_mul(elements, dim, &elements)) {
        throw Error("tensor '" + t.name + "' has an invalid dimension " + std::to_string(dim));
      }
      t.dims.push_back(dim);
    }
    t.type = cur.read<uint32_t>("tensor type");
    const auto type_info = tensor::dtype_info(t.type);
    if (!type_info) {
      throw Error("tensor '" + t.name + "' has unknown type id " + std::to_string(t.type));
    }
    if (t.dims[0] % type_info->block_elements != 0) {
      throw Error("tensor '" + t.name + "': row length " + std::to_string(t.dims[0]) +
                  " is not a multiple of the " + type_info->name + " block size " +
                  std::to_string(type_info->block_elements));
    }
    if (!checked_mul(elements / type_info->block_elements, type_info->block_bytes,
                     &t.size_bytes)) {
      throw Error("tensor '" + t.name + "' is too large");
    }
    t.offset = cur.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0) {
      throw Error("tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                  " is not aligned to " + std::to_string(alignment_));
    }
    tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (cur.position() + alignment_ - 1) / alignment_ * alignment_;
  if (tensor_count > 0 && data_start > size_) {
    throw Error("truncated file: data section starts at " + std::to_string(data_start) +
                " beyond the end (" + std::to_string(size_) + " bytes)");
  }
  data_ = map_ + std::min(data_start, size_);
  const uint64_t data_size = size_ - std::min(data_start, size_);
  for (const TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.size_bytes > data_size - t.offset) {
      throw Error("truncated file: tensor '" + t.name + "' (" + std::to_string(t.size_bytes) +
                  " bytes at data offset " + std::to_string(t.offset) +
                  ") runs past the end of the file");
    }
  }
}

const Value* File::find(std::string_view key) const {
  for (const KeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

namespace {
[[noreturn]] void wrong_type(std::string_view key, const Value& v, const char* wanted) {
  throw Error("metadata key '" + std::string(key) + "' is " + value_type_name(v.type) +
              ", expected " + wanted);
}
}  // namespace

std::optional<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto u = v->as_uint()) return u;
  wrong_type(key, *v, "a non-negative integer");
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto f = v->as_float()) return f;
  wrong_type(key, *v, "a number");
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto b = v->as_bool()) return b;
  wrong_type(key, *v, "a bool");
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (const std::string* s = v->as_string()) return *s;
  wrong_type(key, *v, "a string");
}

const Array* File::get_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return nullptr;
  if (const Array* a = v->as_array()) return a;
  wrong_type(key, *v, "an array");
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace strata::gguf
