// Helpers shared by the tokenizer tests: the shared vocabulary files and a UTF-8 validator that
// is independent of the code under test.
#pragma once

#include <time.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer::test {

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
