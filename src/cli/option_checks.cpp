#include "cli/option_checks.h"

#include <string>

namespace strata::cli {
namespace {

CLI::Validator at_least(double least, bool least_allowed, const std::string& name, const std::string& wanted) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(input, value)) return "expected a number, got '" + input + "'";
        if (value > least || (least_allowed && value == least)) return {};
        return "must be " + wanted + ", got " + input;
      },
      name);
}

}  // namespace

CLI::Validator positive_number() { return at_least(0.0, false, "POSITIVE", "above 0"); }

CLI::Validator non_negative_number() { return at_least(0.0, true, "NONNEGATIVE", "0 or more"); }

}  // namespace strata::cli
