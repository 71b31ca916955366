// What the API tells about itself, in-process against a fake generator: request ids, the log
// line per generation, GET /requests, the counters of GET /metrics, and which keys open what.
#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "api/server.h"
#include "dreams_tokenizer.h"
#include "fake_generator.h"
#include "metrics/metrics.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

class ObservabilityTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    options.log = [this](const std::string& line) {
      std::lock_guard lock(mutex_);
      lines_.push_back(line);
    };
    testing::FakeGenerator::Options fake;
    for (int token = 100; token < 110; ++token) fake.vocabulary.push_back(token);
    generator_ = std::make_unique<testing::FakeGenerator>(fake);
    server_ = std::make_unique<Server>(*generator_, testing::dreams_tokenizer(), "aidreams260K", "", options);
    server_->start();
  }

  httplib::Result complete(const httplib::Headers& headers = {}) {
    httplib::Client client("127.0.0.1", server_->port());
    return client.Post("/v1/completions", headers, R"({"prompt": "Once upon a time", "max_tokens": 5})",
                       "application/json");
  }

  httplib::Result get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client client("127.0.0.1", server_->port());
    return client.Get(path, headers);
  }

  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

  std::unique_ptr<testing::FakeGenerator> generator_;
  std::unique_ptr<Server> server_;
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

TEST_F(ObservabilityTest, EveryAnswerNamesItsRequestTheClientsIdWhenUsable) {
  start();
  const std::regex generated("[0-9a-f]{16}");
  EXPECT_EQ(complete({{"x-request-id", "client-id.7:a_b"}})->get_header_value("x-request-id"), "client-id.7:a_b");
  for (const std::string& unusable : std::vector<std::string>{"has space", std::string(65, 'a'), "quote\""}) {
    EXPECT_TRUE(std::regex_match(complete({{"x-request-id", unusable}})->get_header_value("x-request-id"), generated))
        << unusable;
  }
  const std::string first = complete()->get_header_value("x-request-id");
  const std::string second = get("/v1/models")->get_header_value("x-request-id");
  EXPECT_TRUE(std::regex_match(first, generated)) << first;
  EXPECT_NE(first, second);
}

TEST_F(ObservabilityTest, AGenerationIsLoggedAndListedUnderItsId) {
  start();
  const auto answer = complete({{"x-request-id", "listed-1"}});
  ASSERT_EQ(answer->status, 200);
  const json usage = json::parse(answer->body)["usage"];
  const auto logged = lines();
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0].rfind("request listed-1: generation ended (length) after ", 0), 0u) << logged[0];
  EXPECT_NE(logged[0].find("prompt " + std::to_string(usage["prompt_tokens"].get<int>()) + " tokens (0 cached), 5 generated"),
            std::string::npos) << logged[0];

  const json recent = json::parse(get("/requests")->body)["requests"];
  ASSERT_FALSE(recent.empty());
  EXPECT_EQ(recent[0]["id"], "listed-1");
  EXPECT_EQ(recent[0]["generated_tokens"], 5);
  EXPECT_EQ(recent[0]["prompt_tokens"], usage["prompt_tokens"]);
  EXPECT_EQ(recent[0]["finish"], "length");
  EXPECT_GE(recent[0]["seconds"].get<double>(), recent[0]["first_token_seconds"].get<double>());
  EXPECT_TRUE(recent[0]["queued_seconds"].is_null());  // the fake generator does not say when it starts
}

TEST_F(ObservabilityTest, CountsAnswersByEndpointAndStatusAndTokens) {
  start();
  metrics::Registry& r = metrics::process_registry();
  metrics::Counter& ok = r.counter("strata_http_requests_total", "", {{"endpoint", "/v1/completions"}, {"status", "200"}});
  metrics::Counter& unknown = r.counter("strata_http_requests_total", "", {{"endpoint", "other"}, {"status", "404"}});
  metrics::Counter& generated = r.counter("strata_generation_tokens_total", "");
  const double ok_before = ok.value(), unknown_before = unknown.value(), generated_before = generated.value();
  complete();
  complete();
  get("/v1/nothing");
  EXPECT_EQ(ok.value() - ok_before, 2);
  EXPECT_EQ(unknown.value() - unknown_before, 1);
  EXPECT_EQ(generated.value() - generated_before, 10);
  const auto scraped = get("/metrics");
  EXPECT_EQ(scraped->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(scraped->body.find("# TYPE strata_time_to_first_token_seconds histogram\n"), std::string::npos);
}

TEST_F(ObservabilityTest, TheDashboardsFilesAreOpenAndMetricsNeedTheirKey) {
  ServerOptions options;
  options.api_key = "api-secret";
  options.metrics_key = "scrape-secret";
  start(options);
  const auto page = get("/");
  ASSERT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script src=\"/app.js\""), std::string::npos);
  EXPECT_EQ(page->get_header_value("Content-Security-Policy"), "default-src 'self'; frame-ancestors 'none'");
  EXPECT_EQ(get("/app.js")->status, 200);
  EXPECT_EQ(get("/missing.js")->status, 401);  // not a file of the dashboard: behind the key
  EXPECT_EQ(get("/requests")->status, 401);
  EXPECT_EQ(get("/requests", {{"Authorization", "Bearer api-secret"}})->status, 200);
  EXPECT_EQ(get("/metrics", {{"Authorization", "Bearer api-secret"}})->status, 401);
  EXPECT_EQ(get("/metrics", {{"Authorization", "Bearer scrape-secret"}})->status, 200);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer scrape-secret"}})->status, 401);
}

}  // namespace
}  // namespace strata::api
