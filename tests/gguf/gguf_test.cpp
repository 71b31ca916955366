#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "gguf/gguf.h"
#include "tensor/dtype.h"

namespace strata::gguf {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("strata_gguf_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file with one value of every metadata type and a few tensors of different types.
Writer sample_writer() {
  Writer w;
  w.set("general.architecture", Value::string("llama"));
  w.set("t.u8", Value::u8(200));
  w.set("t.i8", {ValueType::Int8, int64_t{-100}});
  w.set("t.u16", {ValueType::UInt16, uint64_t{60000}});
  w.set("t.i16", {ValueType::Int16, int64_t{-30000}});
  w.set("t.u32", Value::u32(4000000000u));
  w.set("t.i32", Value::i32(-2000000000));
  w.set("t.f32", Value::f32(1.5f));
  w.set("t.bool", Value::boolean(true));
  w.set("t.string", Value::string("héllo wörld"));
  w.set("t.u64", Value::u64(1ull << 60));
  w.set("t.i64", {ValueType::Int64, int64_t{-(1ll << 60)}});
  w.set("t.f64", Value::f64(-2.25));
  w.set("t.strings", Value::array(ValueType::String, {Value::string("a"), Value::string("")}));
  w.set("t.nested", Value::array(ValueType::Array,
                                 {Value::array(ValueType::Int32, {Value::i32(1), Value::i32(-2)})}));
  std::vector<uint8_t> f32(4 * 3 * 4);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i);
  w.add_tensor("a.weight", {4, 3}, static_cast<uint32_t>(tensor::DType::F32), f32);
  w.add_tensor("b.weight", {64, 2}, static_cast<uint32_t>(tensor::DType::Q8_0),
               [](uint8_t* dst, uint64_t n) { std::memset(dst, 7, n); });
  w.add_tensor("c.bias", {5}, static_cast<uint32_t>(tensor::DType::F16),
               std::vector<uint8_t>(10, 1));
  return w;
}

TEST(Gguf, RoundTripsEveryValueTypeAndTensors) {
  TempDir dir;
  const std::string path = dir.file("a.gguf");
  sample_writer().write(path);
  auto f = File::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_uint("t.u8"), 200u);
  EXPECT_EQ(f->find("t.i8")->as_int(), -100);
  EXPECT_EQ(f->get_uint("t.u16"), 60000u);
  EXPECT_EQ(f->find("t.i16")->as_int(), -30000);
  EXPECT_EQ(f->get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(f->find("t.i32")->as_int(), -2000000000);
  EXPECT_EQ(f->get_float("t.f32"), 1.5);
  EXPECT_EQ(f->get_bool("t.bool"), true);
  EXPECT_EQ(f->get_string("t.string"), "héllo wörld");
  EXPECT_EQ(f->get_uint("t.u64"), 1ull << 60);
  EXPECT_EQ(f->find("t.i64")->as_int(), -(1ll << 60));
  EXPECT_EQ(f->get_float("t.f64"), -2.25);
  const Array* strings = f->get_array("t.strings");
  ASSERT_NE(strings, nullptr);
  ASSERT_EQ(strings->items.size(), 2u);
  EXPECT_EQ(*strings->items[0].as_string(), "a");
  EXPECT_EQ(*strings->items[1].as_string(), "");
  const Array* nested = f->get_array("t.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->items[0].as_array()->items[1].as_int(), -2);
  EXPECT_FALSE(f->get_uint("missing").has_value());
  EXPECT_THROW(f->get_uint("t.string"), Error);

  ASSERT_EQ(f->tensors().size(), 3u);
  const TensorInfo* a = f->find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<uint64_t>{4, 3}));
  EXPECT_EQ(a->size_bytes, 48u);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(f->tensor_data(*a)[i], i);
  const TensorInfo* b = f->find_tensor("b.weight");
  EXPECT_EQ(b->size_bytes, 2u * 2 * 34);
  EXPECT_EQ(f->tensor_data(*b)[67], 7);
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor_data(t)) % 32, 0u) << t.name;
  }
}

TEST(Gguf, HonoursCustomAlignment) {
  TempDir dir;
  const std::string path = dir.file("a.gguf");
  sample_writer().write(path, 64);
  auto f = File::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor_data(t)) % 64, 0u) << t.name;
  }
}

TEST(Gguf, ReadsTheSharedModel) {
  auto f = File::open(STRATA_SHARED_DIR "/models/aidreams260K.gguf");
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_uint("llama.block_count"), 4u);
  EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items.size(), 512u);
  EXPECT_EQ(f->tensors().size(), 39u);
}

TEST(Gguf, ReadsEveryVocabFile) {
  for (const auto& entry : fs::directory_iterator(STRATA_SHARED_DIR "/vocab")) {
    if (entry.path().extension() != ".gguf") continue;
    auto f = File::open(entry.path().string());
    EXPECT_TRUE(f->get_string("tokenizer.ggml.model").has_value()) << entry.path();
  }
}

// Expects opening `bytes` to fail with an error containing `needle`.
void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& needle) {
  TempDir dir;
  const std::string path = dir.file("bad.gguf");
  write_all(path, bytes);
  try {
    File::open(path);
    FAIL() << "accepted a file that should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "error was: " << e.what();
  }
}

std::vector<uint8_t> sample_bytes() {
  TempDir dir;
  const std::string path = dir.file("a.gguf");
  sample_writer().write(path);
  return read_all(path);
}

// Offset of the first occurrence of `text` in the file.
size_t find_bytes(const std::vector<uint8_t>& bytes, const std::string& text) {
  auto it = std::search(bytes.begin(), bytes.end(), text.begin(), text.end());
  EXPECT_NE(it, bytes.end()) << text;
  return static_cast<size_t>(it - bytes.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

TEST(GgufCorruption, EveryTruncationIsRejected) {
  const std::vector<uint8_t> good = sample_bytes();
  // The last tensor (c.bias, 10 bytes) is followed by 22 bytes of padding to 32; cutting
  // those leaves a complete file.
  const size_t last_tensor_end = good.size() - 22;
  for (size_t length = 0; length < last_tensor_end; ++length) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<long>(length));
    TempDir dir;
    const std::string path = dir.file("cut.gguf");
    write_all(path, cut);
    EXPECT_THROW(File::open(path), Error) << "length " << length;
  }
}

TEST(GgufCorruption, NamesEachProblem) {
  const std::vector<uint8_t> good = sample_bytes();
  {
    auto b = good;
    b[0] = 'X';
    expect_rejected(b, "bad magic");
  }
  {
    auto b = good;
    poke<uint32_t>(b, 4, 7);
    expect_rejected(b, "unsupported GGUF version 7");
  }
  {
    auto b = good;
    poke<uint64_t>(b, 8, 1ull << 62);
    expect_rejected(b, "tensor count");
  }
  {
    auto b = good;
    poke<uint64_t>(b, 16, 1ull << 62);
    expect_rejected(b, "metadata count");
  }
  {
    auto b = good;  // value type of the first key (general.architecture)
    poke<uint32_t>(b, find_bytes(b, "general.architecture") + 20, 99);
    expect_rejected(b, "unknown value type 99");
  }
  {
    auto b = good;  // length of the first key's string value
    poke<uint64_t>(b, find_bytes(b, "general.architecture") + 24, 1ull << 61);
    expect_rejected(b, "implausible");
  }
  {
    auto b = good;  // array count of t.strings
    poke<uint64_t>(b, find_bytes(b, "t.strings") + 9 + 4 + 4, 1ull << 40);
    expect_rejected(b, "array length");
  }
  {
    auto b = good;  // bool byte
    b[find_bytes(b, "t.bool") + 6 + 4] = 5;
    expect_rejected(b, "bool value 5");
  }
  const size_t a_info = find_bytes(good, "a.weight") + 8;
  {
    auto b = good;
    poke<uint32_t>(b, a_info, 9);
    expect_rejected(b, "dimensions");
  }
  {
    auto b = good;
    poke<uint64_t>(b, a_info + 4, 0);
    expect_rejected(b, "invalid dimension 0");
  }
  {
    auto b = good;
    poke<uint64_t>(b, a_info + 4, 1ull << 41);
    expect_rejected(b, "invalid dimension");
  }
  {
    auto b = good;
    poke<uint32_t>(b, a_info + 4 + 16, 1234);
    expect_rejected(b, "unknown type id 1234");
  }
  {
    auto b = good;  // Q8_0 with a row of 64 -> make it F32 row 4 claims Q8_0: ragged block
    poke<uint32_t>(b, a_info + 4 + 16, static_cast<uint32_t>(tensor::DType::Q8_0));
    expect_rejected(b, "not a multiple");
  }
  {
    auto b = good;
    poke<uint64_t>(b, a_info + 4 + 16 + 4, 3);
    expect_rejected(b, "not aligned");
  }
  {
    auto b = good;
    poke<uint64_t>(b, a_info + 4 + 16 + 4, 1ull << 40);
    expect_rejected(b, "runs past the end");
  }
  {
    auto b = good;  // duplicate key: rename t.u16 to t.u32's name length-preservingly
    const size_t at = find_bytes(b, "t.u16");
    b[at + 3] = '3';
    b[at + 4] = '2';
    expect_rejected(b, "duplicate metadata key");
  }
}

TEST(GgufCorruption, MissingAndEmptyFiles) {
  EXPECT_THROW(File::open("/nonexistent/model.gguf"), Error);
  TempDir dir;
  write_all(dir.file("empty.gguf"), {});
  EXPECT_THROW(File::open(dir.file("empty.gguf")), Error);
  EXPECT_THROW(File::open(dir.file("")), Error);  // a directory
}

}  // namespace
}  // namespace strata::gguf
