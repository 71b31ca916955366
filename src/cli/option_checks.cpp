#include "cli/option_checks.h"

#include <string>

namespace strata::cli {
namespace {

CLI::Validator number_from_zero(bool zero_allowed, const std::string& name, const std::string& wanted) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(input, value)) return "expected a number, got '" + input + "'";
        if (value > 0.0 || (zero_allowed && value == 0.0)) return {};
        return "must be " + wanted + ", got " + input;
      },
      name);
}

}  // namespace

CLI::Validator positive_number() { return number_from_zero(false, "POSITIVE", "above 0"); }

CLI::Validator non_negative_number() { return number_from_zero(true, "NONNEGATIVE", "0 or more"); }

}  // namespace strata::cli
