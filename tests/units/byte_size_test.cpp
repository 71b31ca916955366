// Byte sizes read from flags and written in logs: units, decimals, and input refused with a
// message that quotes it.
#include "units/byte_size.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace strata::units {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(ByteSizes, ParseAcceptsUnitsAndDecimals) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("10B"), 10u);
  EXPECT_EQ(parse_byte_size("2K"), 2048u);
  EXPECT_EQ(parse_byte_size("2KB"), 2000u);
  EXPECT_EQ(parse_byte_size("2KiB"), 2048u);
  EXPECT_EQ(parse_byte_size("800M"), 800 * kMiB);
  EXPECT_EQ(parse_byte_size("800MB"), 800'000'000u);
  EXPECT_EQ(parse_byte_size("12GiB"), 12 * kGiB);
  EXPECT_EQ(parse_byte_size("12gib"), 12 * kGiB);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(parse_byte_size(" 1.5 GB "), 1'500'000'000u);
  EXPECT_EQ(parse_byte_size("1T"), uint64_t{1} << 40);
  EXPECT_EQ(parse_byte_size("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(parse_byte_size("0.25KiB"), 256u);
  EXPECT_EQ(parse_byte_size("3.KB"), 3000u);
}

TEST(ByteSizes, ParseRejectsBadInputQuotingIt) {
  for (const char* bad : {"", "  ", "GiB", "12XB", "12 GiBs", "-1G", "1.2.3G", "1e3", ".", "99999999999T",
                          "123456789012345678901"}) {
    try {
      parse_byte_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ByteSizes, DescribeUsesBinaryUnits) {
  EXPECT_EQ(describe_bytes(0), "0 B");
  EXPECT_EQ(describe_bytes(1023), "1023 B");
  EXPECT_EQ(describe_bytes(1536), "1.5 KiB");
  EXPECT_EQ(describe_bytes(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(describe_bytes(41 * kGiB + kGiB / 5), "41.2 GiB");
}

}  // namespace
}  // namespace strata::units
