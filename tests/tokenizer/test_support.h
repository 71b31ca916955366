// Helpers shared by the tokenizer tests: the shared vocabulary files, readers of llama.cpp's test
// vector format, and a UTF-8 validator that is independent of the code under test.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer::test {

// A vocabulary's name as a test name: gtest allows no '-'.
inline std::string test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

inline std::filesystem::path vocab_dir() {
  return std::filesystem::path(STRATA_SHARED_DIR) / "vocab";
}

struct LoadedTokenizer {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline LoadedTokenizer load(const std::filesystem::path& path) {
  LoadedTokenizer loaded;
  loaded.file = gguf::File::open(path.string());
  loaded.tokenizer = Tokenizer::from_gguf(*loaded.file);
  return loaded;
}

inline LoadedTokenizer load_vocab(std::string_view name) {
  return load(vocab_dir() / ("ggml-vocab-" + std::string(name) + ".gguf"));
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return {std::istreambuf_iterator<char>(in), {}};
}

// A NAME.gguf.inp file: texts, each followed by the separator line (see the vocab README).
inline std::vector<std::string> read_inputs(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t pos = 0;
  for (size_t found; (found = text.find(separator, pos)) != std::string::npos;
       pos = found + separator.size()) {
    inputs.push_back(text.substr(pos, found - pos));
  }
  if (pos != text.size())
    throw std::runtime_error(path.string() + " does not end with a separator");
  return inputs;
}

// A NAME.gguf.out file: one line of space-separated token ids per text.
inline std::vector<std::vector<Token>> read_outputs(const std::filesystem::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::vector<Token>> outputs;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    std::vector<Token>& tokens = outputs.emplace_back();
    for (Token id; ids >> id;) tokens.push_back(id);
  }
  return outputs;
}

// The NAME of every ggml-vocab-NAME.gguf.inp in `dir`, sorted.
inline std::vector<std::string> vocabularies_with_vectors(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    const std::string prefix = "ggml-vocab-", suffix = ".gguf.inp";
    if (file.starts_with(prefix) && file.ends_with(suffix)) {
      names.push_back(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The time this thread has run, not the wall time: speed bounds in tests catch a quadratic
// encoder, and a loaded machine must not trip them.
inline std::chrono::nanoseconds thread_cpu_time() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

// Strict UTF-8: no overlong forms, surrogates, values past U+10FFFF or truncated sequences.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t extra = 0;
    unsigned cp = 0;
    unsigned min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      extra = 1, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      extra = 2, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      extra = 3, cp = b & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace strata::tokenizer::test
