// Where a command's model comes from: the file given with -m, or a generated demo model.
#pragma once

#include <string>

namespace strata::cli {

// Returns `given` when set. Otherwise writes (once, into the user's cache folder) a small
// random-weight demo model, says so on stderr, and returns its path.
std::string model_path_or_demo(const std::string& given);

}  // namespace strata::cli
