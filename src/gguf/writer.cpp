#include <cstdio>
#include <cstring>
#include <memory>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::gguf {
namespace {

class Output {
 public:
  explicit Output(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "wb")) {
    if (file_ == nullptr) throw Error("cannot create '" + path + "': " + std::strerror(errno));
  }
  ~Output() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void bytes(const void* data, size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, file_) != n) {
      throw Error("write to '" + path_ + "' failed: " + std::strerror(errno));
    }
    written_ += n;
  }
  template <typename T>
  void pod(T value) {
    bytes(&value, sizeof(T));
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    while (written_ % alignment != 0) {
      bytes(zeros, std::min<uint64_t>(sizeof zeros, alignment - written_ % alignment));
    }
  }
  void close() {
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throw Error("closing '" + path_ + "' failed: " + std::strerror(errno));
  }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  std::FILE* file_;
  uint64_t written_ = 0;
};

void write_value(Output& out, const Value& v) {
  switch (v.type) {
    case ValueType::UInt8: out.pod<uint8_t>(static_cast<uint8_t>(*v.as_uint())); break;
    case ValueType::Int8: out.pod<int8_t>(static_cast<int8_t>(*v.as_int())); break;
    case ValueType::UInt16: out.pod<uint16_t>(static_cast<uint16_t>(*v.as_uint())); break;
    case ValueType::Int16: out.pod<int16_t>(static_cast<int16_t>(*v.as_int())); break;
    case ValueType::UInt32: out.pod<uint32_t>(static_cast<uint32_t>(*v.as_uint())); break;
    case ValueType::Int32: out.pod<int32_t>(static_cast<int32_t>(*v.as_int())); break;
    case ValueType::UInt64: out.pod<uint64_t>(*v.as_uint()); break;
    case ValueType::Int64: out.pod<int64_t>(*v.as_int()); break;
    case ValueType::Float32: out.pod<float>(static_cast<float>(*v.as_float())); break;
    case ValueType::Float64: out.pod<double>(*v.as_float()); break;
    case ValueType::Bool: out.pod<uint8_t>(*v.as_bool() ? 1 : 0); break;
    case ValueType::String: out.string(*v.as_string()); break;
    case ValueType::Array: {
      const Array& a = *v.as_array();
      out.pod<uint32_t>(static_cast<uint32_t>(a.element_type));
      out.pod<uint64_t>(a.items.size());
      for (const Value& item : a.items) {
        if (item.type != a.element_type) throw Error("array item of the wrong type");
        write_value(out, item);
      }
      break;
    }
  }
}

}  // namespace

void Writer::set(std::string key, Value value) {
  for (KeyValue& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back({std::move(key), std::move(value)});
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type,
                        Producer produce) {
  const auto type_info = tensor::dtype_info(type);
  if (!type_info) throw Error("unknown tensor type id " + std::to_string(type));
  if (dims.empty() || dims.size() > 4) throw Error("tensor '" + name + "' needs 1 to 4 dims");
  PendingTensor t;
  t.info.name = std::move(name);
  t.info.dims = std::move(dims);
  t.info.type = type;
  if (t.info.dims[0] % type_info->block_elements != 0) {
    throw Error("tensor '" + t.info.name + "' row is not a whole number of blocks");
  }
  t.info.size_bytes = t.info.elements() / type_info->block_elements * type_info->block_bytes;
  t.produce = std::move(produce);
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> dims, uint32_t type,
                        std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const std::string label = name;
  add_tensor(std::move(name), std::move(dims), type, [shared, label](uint8_t* dst, uint64_t n) {
    if (shared->size() != n) throw Error("tensor '" + label + "' has the wrong byte count");
    std::memcpy(dst, shared->data(), n);
  });
}

void Writer::write(const std::string& path, uint64_t alignment, const Progress& progress) const {
  Output out(path);
  out.bytes("GGUF", 4);
  out.pod<uint32_t>(3);
  out.pod<uint64_t>(tensors_.size());
  const bool custom_alignment = alignment != 32;
  out.pod<uint64_t>(metadata_.size() + (custom_alignment ? 1 : 0));
  for (const KeyValue& kv : metadata_) {
    if (kv.key == "general.alignment") throw Error("set alignment through write()");
    out.string(kv.key);
    out.pod<uint32_t>(static_cast<uint32_t>(kv.value.type));
    write_value(out, kv.value);
  }
  if (custom_alignment) {
    out.string("general.alignment");
    out.pod<uint32_t>(static_cast<uint32_t>(ValueType::UInt32));
    out.pod<uint32_t>(static_cast<uint32_t>(alignment));
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    out.string(t.info.name);
    out.pod<uint32_t>(static_cast<uint32_t>(t.info.dims.size()));
    for (uint64_t d : t.info.dims) out.pod<uint64_t>(d);
    out.pod<uint32_t>(t.info.type);
    out.pod<uint64_t>(offset);
    offset = (offset + t.info.size_bytes + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  std::vector<uint8_t> buffer;
  uint64_t total = 0;
  for (const PendingTensor& t : tensors_) total += t.info.size_bytes;
  uint64_t written = 0;
  for (const PendingTensor& t : tensors_) {
    if (progress) progress(written, total);
    buffer.resize(t.info.size_bytes);
    t.produce(buffer.data(), buffer.size());
    out.bytes(buffer.data(), buffer.size());
    out.pad_to(alignment);
    written += t.info.size_bytes;
  }
  out.close();
  if (progress) progress(written, total);
}

}  // namespace strata::gguf
