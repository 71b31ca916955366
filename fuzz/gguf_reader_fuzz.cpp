// libFuzzer target: any bytes given to the GGUF reader must give a File or a gguf::Error,
// never a crash, a hang or unbounded memory.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader maps real files, so the input goes through one (in memory-backed /dev/shm).
  static const std::string path = "/dev/shm/strata_gguf_fuzz_" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = strata::gguf::File::open(path);
    // Touch everything the reader claims is valid.
    uint64_t sum = 0;
    for (const auto& kv : file->metadata()) sum += kv.value.to_display().size();
    for (const auto& t : file->tensors()) {
      if (t.size_bytes > 0) sum += file->tensor_data(t)[0] + file->tensor_data(t)[t.size_bytes - 1];
    }
    volatile uint64_t keep = sum;
    (void)keep;
  } catch (const strata::gguf::Error&) {
  }
  return 0;
}
