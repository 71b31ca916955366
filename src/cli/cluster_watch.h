// What `strata cluster --watch` adds to the table: live figures from two scrapes of a node's
// /metrics, and a frame drawn over the previous one in place on a terminal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace strata::cli {

// The sum of every sample of the metric `name` (all its label sets) in Prometheus text; 0 when
// there is none.
double metric_total(std::string_view exposition, std::string_view name);

// "generated 12.5 tokens/s here, stage 40.0 inputs/s, 2 running, 0 waiting, KV 10/64 blocks",
// from scrapes `seconds` apart.
std::string live_figures(std::string_view before, std::string_view after, double seconds);

// A line per node with a stage, from two of a node's /cluster answers: the inputs its stage
// computed per second between the two descriptions of it that they carry (gossip brings every
// node's), and its KV pool's use: "  n1: stage 40.0 inputs/s, KV 10/64 blocks". A node whose
// figures did not move on, or started again, shows "-" for its rate.
std::string node_figures(const nlohmann::json& before, const nlohmann::json& after);

// `frame` written over the last one: from the screen's top left, each line cleared to its end
// and the rest of the screen below, so that nothing blinks.
std::string redrawn(std::string_view frame);

}  // namespace strata::cli
