// `strata cluster`'s table says each thing once: a row per node, the placement's reason a line
// per stage, and what the cluster waits for only where the placement does not say it already.
#include "cli/cluster_table.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::cli {
namespace {

using json = nlohmann::json;

int occurrences(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

json node(const std::string& id, bool self) {
  return {{"id", id},           {"self", self},        {"node_address", "127.0.0.1:8081"},
          {"api_address", "127.0.0.1:8080"}, {"memory", "1.0 GiB"}, {"weight_bytes_per_second", 5e9},
          {"state", "ready"},   {"held_sequences", 0}};
}

json status(json placement) {
  return {{"model", {{"name", "m"}, {"hash", std::string(64, 'a')}, {"layers", 4}}},
          {"leader", "a"},
          {"serving", false},
          {"nodes", {node("a", true), node("b", false)}},
          {"placement", std::move(placement)}};
}

TEST(ClusterTable, SaysEachStageOfThePlacementOnce) {
  const std::string reason = "memory strategy (layers in proportion to usable memory): 2 of 2 nodes\n"
                             "  a: layers 0..1, 771.0 KiB of 1.0 GiB usable, 0.01 ms per token\n"
                             "  b: layers 2..3, 771.2 KiB of 1.0 GiB usable, 0.02 ms per token";
  json placement = {{"epoch", 2}, {"leader", "a"}, {"strategy", "memory"}, {"reason", reason}, {"error", ""},
                    {"stages", {{{"node", "a"}, {"first_layer", 0}, {"last_layer", 2}},
                                {{"node", "b"}, {"first_layer", 2}, {"last_layer", 4}}}}};
  const std::string table = cluster_table(status(placement));
  EXPECT_EQ(occurrences(table, "  a: layers 0..1"), 1) << table;
  EXPECT_EQ(occurrences(table, "  b: layers 2..3"), 1) << table;
  EXPECT_EQ(occurrences(table, "0-1"), 1) << table;
  EXPECT_EQ(occurrences(table, "2-3"), 1) << table;
}

// Each member of a tensor-parallel group shows the group's layers and its own share of them.
TEST(ClusterTable, ShowsEachGroupMembersShare) {
  const json group = json::array({json{{"node", "a"}, {"share", 0.75}}, json{{"node", "b"}, {"share", 0.25}}});
  const json stage = {{"node", "a"}, {"first_layer", 0}, {"last_layer", 4}, {"group", group}};
  json placement = {{"epoch", 3}, {"leader", "a"}, {"strategy", "fixed"}, {"reason", ""}, {"error", ""},
                    {"stages", json::array({stage})}};
  const std::string table = cluster_table(status(placement));
  EXPECT_EQ(occurrences(table, "0-3 75%"), 1) << table;
  EXPECT_EQ(occurrences(table, "0-3 25%"), 1) << table;
}

// A placement that does not fit names every node's shortfall: said once, not again as what the
// cluster waits for.
TEST(ClusterTable, SaysWhyTheModelDoesNotFitOnce) {
  const std::string error = "the model does not fit this cluster: 1.5 MiB missing; node 'a' (300.0 KiB) is too small "
                            "for one layer and its KV; node 'b' (300.0 KiB) is too small for one layer and its KV";
  json body = status({{"epoch", 1}, {"leader", "a"}, {"strategy", "speed"}, {"reason", ""}, {"error", error},
                      {"stages", json::array()}});
  body["waiting_for"] = error;
  const std::string table = cluster_table(body);
  EXPECT_EQ(occurrences(table, "node 'a' (300.0 KiB) is too small"), 1) << table;
  EXPECT_EQ(occurrences(table, "node 'b' (300.0 KiB) is too small"), 1) << table;
}

TEST(ClusterTable, SaysWhatTheClusterWaitsForBeforeAPlacement) {
  json body = status({{"epoch", 0}, {"leader", ""}, {"strategy", ""}, {"reason", ""}, {"error", ""},
                      {"stages", json::array()}});
  body["waiting_for"] = "a placement (2 node(s) known)";
  EXPECT_EQ(occurrences(cluster_table(body), "waiting for: a placement (2 node(s) known)\n"), 1) << cluster_table(body);
}

}  // namespace
}  // namespace strata::cli
