// Checks of numeric options whose failures read as a person would say them: CLI11's own
// PositiveNumber and NonNegativeNumber name their range up to the largest double, written out
// in full ("Value 0 not in range 0.000000 to 179769313486...").
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

// A number above 0 ("--parallel: must be above 0, got 0").
CLI::Validator positive_number();

// A number of 0 or more.
CLI::Validator non_negative_number();

}  // namespace strata::cli
