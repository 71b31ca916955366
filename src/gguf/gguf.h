// GGUF model files: a validating, memory-mapped reader and a writer.
//
// The reader checks everything it takes from the file (sizes, offsets, types, string
// lengths, dimensions) and throws gguf::Error naming the problem; it never trusts the file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace strata::gguf {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Metadata value types, numbered as in the GGUF specification.
enum class ValueType : uint32_t {
  UInt8 = 0, Int8 = 1, UInt16 = 2, Int16 = 3, UInt32 = 4, Int32 = 5, Float32 = 6,
  Bool = 7, String = 8, Array = 9, UInt64 = 10, Int64 = 11, Float64 = 12,
};
const char* value_type_name(ValueType type);

struct Value;
struct Array {
  ValueType element_type = ValueType::UInt8;
  std::vector<Value> items;
};

struct Value {
  ValueType type = ValueType::UInt8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value u8(uint8_t v) { return {ValueType::UInt8, uint64_t{v}}; }
  static Value u32(uint32_t v) { return {ValueType::UInt32, uint64_t{v}}; }
  static Value u64(uint64_t v) { return {ValueType::UInt64, v}; }
  static Value i32(int32_t v) { return {ValueType::Int32, int64_t{v}}; }
  static Value f32(float v) { return {ValueType::Float32, double{v}}; }
  static Value f64(double v) { return {ValueType::Float64, v}; }
  static Value boolean(bool v) { return {ValueType::Bool, v}; }
  static Value string(std::string v) { return {ValueType::String, std::move(v)}; }
  static Value array(ValueType element_type, std::vector<Value> items) {
    return {ValueType::Array, Array{element_type, std::move(items)}};
  }

  // Typed views; nullopt when the value is of another kind.
  std::optional<uint64_t> as_uint() const;  // any non-negative integer
  std::optional<int64_t> as_int() const;    // any integer that fits int64
  std::optional<double> as_float() const;   // any number
  std::optional<bool> as_bool() const;
  const std::string* as_string() const;
  const Array* as_array() const;
  std::string to_display(size_t max_items = 8) const;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] is the contiguous (row) dimension, as in ggml
  uint32_t type = 0;           // ggml type id (see tensor/dtype.h)
  uint64_t offset = 0;         // relative to the start of the data section
  uint64_t size_bytes = 0;     // computed from type and dims
  uint64_t elements() const;
};

// A GGUF file opened read-only and memory-mapped.
class File {
 public:
  static std::unique_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  // Typed look-ups: nullopt when absent; Error when present with an unusable type.
  std::optional<uint64_t> get_uint(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const Array* get_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const uint8_t* tensor_data(const TensorInfo& info) const { return data_ + info.offset; }
  // The header, metadata and tensor table: everything before the tensor data.
  std::span<const uint8_t> header_bytes() const { return {map_, static_cast<size_t>(data_ - map_)}; }
  // Says that [begin, begin + bytes) of the mapping will not be read soon, e.g. after its
  // tensor was copied into another layout: the whole pages inside it leave this process's
  // resident memory (the kernel's page cache may keep them). Reading them again still
  // works; it maps them in anew.
  void release_pages(const uint8_t* begin, uint64_t bytes) const;

 private:
  File() = default;
  void parse();

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  const uint8_t* data_ = nullptr;
};

// Builds a GGUF v3 file: metadata, then tensors whose bytes are produced on demand,
// so multi-gigabyte models are written without holding them in memory.
class Writer {
 public:
  void set(std::string key, Value value);
  // `produce` writes exactly the tensor's byte size into the given buffer.
  using Producer = std::function<void(uint8_t* dst, uint64_t bytes)>;
  void add_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type, Producer produce);
  void add_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type,
                  std::vector<uint8_t> bytes);
  // `progress` (optional) hears how many of the tensors' bytes are written, of how many: before
  // each tensor's bytes are produced, and once they all are.
  using Progress = std::function<void(uint64_t written, uint64_t total)>;
  void write(const std::string& path, uint64_t alignment = 32, const Progress& progress = {}) const;

 private:
  struct PendingTensor {
    TensorInfo info;
    Producer produce;
  };
  std::vector<KeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace strata::gguf
