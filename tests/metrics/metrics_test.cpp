#include "metrics/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace strata::metrics {
namespace {

TEST(Exposition, GroupsEachFamilysSamplesUnderOneHelpAndType) {
  Exposition out;
  out.gauge("strata_node_up", "Whether the node answers.", {{"node", "a"}}, 1);
  out.counter("strata_requests_total", "Requests answered.", {}, 3);
  out.gauge("strata_node_up", "Whether the node answers.", {{"node", "b"}}, 0);
  EXPECT_EQ(out.text(),
            "# HELP strata_node_up Whether the node answers.\n"
            "# TYPE strata_node_up gauge\n"
            "strata_node_up{node=\"a\"} 1\n"
            "strata_node_up{node=\"b\"} 0\n"
            "# HELP strata_requests_total Requests answered.\n"
            "# TYPE strata_requests_total counter\n"
            "strata_requests_total 3\n");
}

TEST(Exposition, EscapesLabelValuesAndHelp) {
  Exposition out;
  out.gauge("x", "a \\ b\nc", {{"path", "q\"\\\n"}}, 0.1);
  EXPECT_EQ(out.text(), "# HELP x a \\\\ b\\nc\n# TYPE x gauge\nx{path=\"q\\\"\\\\\\n\"} 0.1\n");
}

TEST(Exposition, RefusesOneNameAsTwoKinds) {
  Exposition out;
  out.gauge("x", "", {}, 1);
  EXPECT_THROW(out.counter("x", "", {}, 1), std::logic_error);
}

TEST(Histogram, WritesCumulativeBucketsSumAndCount) {
  Histogram h({0.5, 1, 2});
  for (const double v : {0.1, 0.5, 0.7, 3.0, 5.0}) h.observe(v);
  Exposition out;
  out.histogram("t_seconds", "T.", {{"stage", "0"}}, h.snapshot());
  EXPECT_EQ(out.text(),
            "# HELP t_seconds T.\n# TYPE t_seconds histogram\n"
            "t_seconds_bucket{stage=\"0\",le=\"0.5\"} 2\n"
            "t_seconds_bucket{stage=\"0\",le=\"1\"} 3\n"
            "t_seconds_bucket{stage=\"0\",le=\"2\"} 3\n"
            "t_seconds_bucket{stage=\"0\",le=\"+Inf\"} 5\n"
            "t_seconds_sum{stage=\"0\"} 9.3\n"
            "t_seconds_count{stage=\"0\"} 5\n");
}

TEST(Histogram, RefusesBoundsOutOfOrder) {
  EXPECT_THROW(Histogram({1, 0.5}), std::invalid_argument);
  EXPECT_THROW(Histogram({1, 1}), std::invalid_argument);
}

TEST(Registry, FindsTheSameInstrumentByNameAndLabels) {
  Registry registry;
  registry.counter("c_total", "C.", {{"k", "1"}}).add(2);
  registry.counter("c_total", "C.", {{"k", "1"}}).add(3);
  registry.counter("c_total", "C.", {{"k", "2"}}).add();
  EXPECT_EQ(registry.counter("c_total", "C.", {{"k", "1"}}).value(), 5);
  EXPECT_THROW(registry.gauge("c_total", "C.", {{"k", "1"}}), std::logic_error);
  EXPECT_EQ(registry.text(), "# HELP c_total C.\n# TYPE c_total counter\nc_total{k=\"1\"} 5\nc_total{k=\"2\"} 1\n");
}

TEST(Registry, CountsEveryAddFromManyThreads) {
  Registry registry;
  Counter& c = registry.counter("c_total", "C.");
  Histogram& h = registry.histogram("h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.add();
        h.observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.snapshot().count, 40000u);
  EXPECT_THROW(c.add(-1), std::invalid_argument);
}

TEST(Registry, RunsCollectorsWhileTheirRegistrationLives) {
  Registry registry;
  {
    const Registry::Registration kept = registry.add_collector([](Exposition& out) { out.gauge("g", "G.", {}, 7); });
    EXPECT_EQ(registry.text(), "# HELP g G.\n# TYPE g gauge\ng 7\n");
  }
  EXPECT_EQ(registry.text(), "");
}

}  // namespace
}  // namespace strata::metrics
