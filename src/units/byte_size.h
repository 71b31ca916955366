// Sizes in bytes as people write and read them: flags such as --memory-limit 12GiB, and the
// sizes in logs, progress lines and errors.
#pragma once

#include <cstdint>
#include <string>

namespace strata::units {

// "512 B", "1.5 KiB", "41.2 GiB".
std::string describe_bytes(uint64_t bytes);

// "12GiB", "1.5 GB", "800M", "4096": B, K/KiB (1024), KB (1000), and so on up to T/TiB/TB;
// K, M, G and T alone are binary. Units are case-insensitive. Throws std::invalid_argument
// quoting the input.
uint64_t parse_byte_size(const std::string& text);

}  // namespace strata::units
