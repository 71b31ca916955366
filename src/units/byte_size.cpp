#include "units/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string_view>

namespace strata::units {

std::string describe_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

uint64_t parse_byte_size(const std::string& text) {
  auto fail = [&](const std::string& why) -> uint64_t {
    throw std::invalid_argument("invalid size '" + text + "': " + why +
                                " (examples: 12GiB, 1.5GB, 800M, 4096)");
  };
  const size_t begin = text.find_first_not_of(' ');
  if (begin == std::string::npos) return fail("it is empty");
  size_t number_end = begin;
  while (number_end < text.size() && (std::isdigit(static_cast<unsigned char>(text[number_end])) || text[number_end] == '.')) {
    ++number_end;
  }
  // Digits with at most one point, read by hand: libc++ 14 has no std::from_chars for
  // floating point, and strtod would take the decimal point of the C locale. Up to 15
  // significant digits and 22 decimals both operands of the division are exact, so the
  // result is correctly rounded, as from_chars's would be.
  uint64_t mantissa = 0;
  int fraction_digits = 0;
  bool point = false, digits = false;
  for (size_t i = begin; i < number_end; ++i) {
    if (text[i] == '.') {
      if (point) return fail("it does not start with a number");
      point = true;
      continue;
    }
    if (mantissa > (std::numeric_limits<uint64_t>::max() - 9) / 10) return fail("it has too many digits");
    mantissa = mantissa * 10 + static_cast<uint64_t>(text[i] - '0');
    fraction_digits += point ? 1 : 0;
    digits = true;
  }
  if (!digits) return fail("it does not start with a number");
  const double value = static_cast<double>(mantissa) / std::pow(10.0, fraction_digits);

  std::string unit = text.substr(number_end);
  unit.erase(0, unit.find_first_not_of(' '));
  unit.erase(unit.find_last_not_of(' ') + 1);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double multiplier = 1.0;
  if (!unit.empty() && unit != "b") {
    static constexpr std::string_view kPrefixes = "kmgt";
    const size_t power = kPrefixes.find(unit[0]);
    const std::string suffix = unit.substr(1);
    if (power == std::string_view::npos || !(suffix.empty() || suffix == "b" || suffix == "ib")) {
      return fail("unknown unit '" + unit + "'; use B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB or TiB");
    }
    multiplier = std::pow(suffix == "b" ? 1000.0 : 1024.0, static_cast<double>(power + 1));
  }
  const double bytes = std::round(value * multiplier);
  if (bytes >= 18446744073709551616.0) return fail("it is too large");
  return static_cast<uint64_t>(bytes);
}

}  // namespace strata::units
