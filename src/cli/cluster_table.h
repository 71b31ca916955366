// What `strata cluster` prints of a node's GET /cluster: the model and placement, a row per
// node, and why the placement is what it is (or what the cluster waits for).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata::cli {

std::string cluster_table(const nlohmann::json& status);

}  // namespace strata::cli
