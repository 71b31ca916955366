#include "cli/cluster_watch.h"

#include <gtest/gtest.h>

namespace strata::cli {
namespace {

constexpr std::string_view kBefore =
    "# TYPE strata_generation_tokens_total counter\n"
    "strata_generation_tokens_total 100\n"
    "# TYPE strata_stage_batch_inputs histogram\n"
    "strata_stage_batch_inputs_sum{layers=\"0-1\"} 10\n"
    "strata_stage_batch_inputs_count{layers=\"0-1\"} 3\n";

constexpr std::string_view kAfter =
    "# TYPE strata_generation_tokens_total counter\n"
    "strata_generation_tokens_total 125\n"
    "strata_generation_tokens_total_extra 9\n"
    "strata_stage_batch_inputs_sum{layers=\"0-1\"} 50\n"
    "strata_stage_batch_inputs_sum{layers=\"2-3\",note=\"a } b\"} 30\n"
    "strata_requests_running 2\n"
    "strata_requests_waiting 1\n"
    "strata_kv_blocks{state=\"used\"} 10\n"
    "strata_kv_blocks{state=\"free\"} 54\n"
    "strata_kv_pool_blocks 64\n";

TEST(MetricTotal, SumsEveryLabelSetOfExactlyThatName) {
  EXPECT_EQ(metric_total(kAfter, "strata_generation_tokens_total"), 125);
  EXPECT_EQ(metric_total(kAfter, "strata_stage_batch_inputs_sum"), 80);
  EXPECT_EQ(metric_total(kAfter, "strata_kv_blocks{state=\"free\"}"), 54);
  EXPECT_EQ(metric_total(kAfter, "strata_missing"), 0);
}

TEST(LiveFigures, RatesFromTwoScrapes) {
  EXPECT_EQ(live_figures(kBefore, kAfter, 2.0),
            "generated 12.5 tokens/s here, stage 35.0 inputs/s, 2 running, 1 waiting, KV 10/64 blocks");
}

TEST(NodeFigures, EveryStagesRateFromTheDescriptionsOfTwoAnswers) {
  const auto node = [](const char* id, double inputs, double at, int used) {
    return nlohmann::json{{"id", id},
                          {"stage_inputs", inputs},
                          {"described_unix_ms", at},
                          {"kv_cache", {{"used_blocks", used}, {"pool_blocks", 64}}}};
  };
  const nlohmann::json before{{"nodes", {node("a", 100, 1000, 4), node("b", 50, 1000, 2), node("c", 70, 1000, 1),
                                         {{"id", "leader-without-stage"}}}}};
  // b's description is the same one (no gossip yet); c started again (fewer inputs).
  nlohmann::json after{{"nodes", {node("a", 180, 3000, 10), node("b", 50, 1000, 2), node("c", 5, 2500, 3),
                                  node("d", 9, 3000, 0), {{"id", "leader-without-stage"}}}}};
  after["nodes"][3]["kv_cache"]["window"] = {{"used_blocks", 5}, {"pool_blocks", 8}};  // sliding-window layers
  EXPECT_EQ(node_figures(before, after),
            "  a: stage 40.0 inputs/s, KV 10/64 blocks\n"
            "  b: stage - inputs/s, KV 2/64 blocks\n"
            "  c: stage - inputs/s, KV 3/64 blocks\n"
            "  d: stage - inputs/s, KV 0/64 blocks, window KV 5/8\n");
}

TEST(Redrawn, OverwritesEachLineInPlace) {
  EXPECT_EQ(redrawn("a\nbc\n"), "\033[Ha\033[K\nbc\033[K\n\033[J");
}

}  // namespace
}  // namespace strata::cli
