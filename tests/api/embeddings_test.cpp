// /v1/embeddings and /api/embed over HTTP with the real engine on the shared model (served as if
// its GGUF declared mean pooling): each vector is the engine's pooled vector at unit length,
// alone or among other inputs, as floats or base64, and bad requests get 400s that say why.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "api/embeddings.h"
#include "api/server.h"
#include "dreams_engine.h"
#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

using json = nlohmann::json;

class EmbeddingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::dreams_engine({.max_parallel = 4, .max_queued = 32, .threads = 2});
    server_ = start({.host = "127.0.0.1", .port = 0, .embedding_pooling = model::Pooling::Mean, .embedding_dim = 64});
  }
  void TearDown() override {
    server_->stop();
    engine_->shutdown();
  }
  std::unique_ptr<Server> start(ServerOptions options) {
    auto server = std::make_unique<Server>(*engine_, tokenizer_, "aidreams260K", "", std::move(options));
    server->start();
    return server;
  }

  httplib::Result post(const Server& server, const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(60, 0);
    return c.Post(path, body.dump(), "application/json");
  }
  json ok(const std::string& path, const json& body) const {
    auto reply = post(*server_, path, body);
    EXPECT_TRUE(reply);
    if (!reply) return {};
    EXPECT_EQ(reply->status, 200) << reply->body;
    return json::parse(reply->body);
  }

  // The engine's own pooled vector for the tokens, as the API would tokenize the text.
  std::vector<float> engine_vector(const std::string& text) {
    engine::GenerationRequest r;
    r.prompt = tokenizer_.encode(text, true, true);
    r.embedding = model::Pooling::Mean;
    std::promise<std::vector<float>> vector;
    engine::RequestCallbacks callbacks;
    callbacks.on_embedding = [&](std::vector<float> v) { vector.set_value(std::move(v)); };
    EXPECT_TRUE(engine_->submit(std::move(r), callbacks));
    return vector.get_future().get();
  }

  const tokenizer::Tokenizer& tokenizer_ = testing::dreams_tokenizer();
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Server> server_;
};

double length(const std::vector<float>& v) {
  double squares = 0.0;
  for (float x : v) squares += double(x) * x;
  return std::sqrt(squares);
}

std::vector<float> from_base64(const std::string& text) {
  static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t bits = 0;
  int held = 0;
  for (char c : text) {
    if (c == '=') break;
    bits = (bits << 6) | static_cast<uint32_t>(alphabet.find(c));
    held += 6;
    if (held >= 8) {
      held -= 8;
      bytes.push_back(static_cast<char>((bits >> held) & 0xffu));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);  // little-endian, as this machine
  return out;
}

TEST_F(EmbeddingsTest, EachVectorIsTheEnginesAtUnitLength) {
  const std::vector<std::string> texts{"Once upon a time", "The robot", "In the garden of stars"};
  const json answer = ok("/v1/embeddings", {{"input", texts}, {"model", "aidreams260K"}});
  EXPECT_EQ(answer["object"], "list");
  EXPECT_EQ(answer["model"], "aidreams260K");
  ASSERT_EQ(answer["data"].size(), texts.size());
  int tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& item = answer["data"][i];
    EXPECT_EQ(item["object"], "embedding");
    EXPECT_EQ(item["index"], i);
    const auto vector = item["embedding"].get<std::vector<float>>();
    const std::vector<float> pooled = engine_vector(texts[i]);
    ASSERT_EQ(vector.size(), pooled.size());
    EXPECT_NEAR(length(vector), 1.0, 1e-6);
    const double scale = length(pooled);
    for (size_t d = 0; d < vector.size(); ++d) EXPECT_NEAR(vector[d], pooled[d] / scale, 1e-6) << i << " " << d;
    // Alone it is the same, bit for bit: JSON carries each float's shortest exact text.
    const json single = ok("/v1/embeddings", {{"input", texts[i]}});
    EXPECT_EQ(single["data"][0]["embedding"], item["embedding"]);
    tokens += static_cast<int>(tokenizer_.encode(texts[i], true, true).size());
  }
  EXPECT_EQ(answer["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(answer["usage"]["total_tokens"], tokens);
}

TEST_F(EmbeddingsTest, Base64CarriesTheSameFloats) {
  const json floats = ok("/v1/embeddings", {{"input", "The moon said"}});
  const json packed = ok("/v1/embeddings", {{"input", "The moon said"}, {"encoding_format", "base64"}});
  ASSERT_TRUE(packed["data"][0]["embedding"].is_string());
  EXPECT_EQ(from_base64(packed["data"][0]["embedding"].get<std::string>()),
            floats["data"][0]["embedding"].get<std::vector<float>>());
}

TEST_F(EmbeddingsTest, TokenInputsAndDimensions) {
  const std::vector<engine::Token> ids = tokenizer_.encode("Far away", true, true);
  const json by_text = ok("/v1/embeddings", {{"input", "Far away"}});
  const json by_ids = ok("/v1/embeddings", {{"input", json::array({ids})}});
  EXPECT_EQ(by_ids["data"][0]["embedding"], by_text["data"][0]["embedding"]);
  EXPECT_EQ(ok("/v1/embeddings", {{"input", ids}})["data"][0]["embedding"], by_text["data"][0]["embedding"]);
  // Fewer dimensions: the leading ones, at unit length again.
  const auto whole = by_text["data"][0]["embedding"].get<std::vector<float>>();
  const auto cut = ok("/v1/embeddings", {{"input", "Far away"}, {"dimensions", 16}})["data"][0]["embedding"]
                       .get<std::vector<float>>();
  ASSERT_EQ(cut.size(), 16u);
  EXPECT_NEAR(length(cut), 1.0, 1e-6);
  const double scale = length({whole.begin(), whole.begin() + 16});
  for (size_t d = 0; d < cut.size(); ++d) EXPECT_NEAR(cut[d], whole[d] / scale, 1e-6);
}

TEST_F(EmbeddingsTest, OllamaEmbedTruncatesUnlessToldNot) {
  const json answer = ok("/api/embed", {{"model", "aidreams260K"}, {"input", {"Pixels", "Colors"}}});
  EXPECT_EQ(answer["model"], "aidreams260K");
  ASSERT_EQ(answer["embeddings"].size(), 2u);
  EXPECT_EQ(answer["embeddings"][0], ok("/v1/embeddings", {{"input", "Pixels"}})["data"][0]["embedding"]);
  EXPECT_GT(answer["total_duration"].get<int64_t>(), 0);
  EXPECT_EQ(answer["prompt_eval_count"], tokenizer_.encode("Pixels", true, true).size() +
                                             tokenizer_.encode("Colors", true, true).size());
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "The last dream of the city at night. ";
  const json cut = ok("/api/embed", {{"input", long_text}});
  EXPECT_EQ(cut["prompt_eval_count"], 128) << "the context";
  auto refused = post(*server_, "/api/embed", {{"input", long_text}, {"truncate", false}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("context length"), std::string::npos) << refused->body;
}

TEST_F(EmbeddingsTest, BadRequestsSayWhatIsWrong) {
  const auto status_and_body = [&](const Server& server, const std::string& path, const json& body) {
    auto reply = post(server, path, body);
    EXPECT_TRUE(reply);
    return reply ? std::pair(reply->status, reply->body) : std::pair(0, std::string());
  };
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "The last dream of the city at night. ";
  for (const auto& [body, says] : std::vector<std::pair<json, std::string>>{
           {json{{"input", ""}}, "nothing to embed"},
           {json{{"input", json::array()}}, "nothing to embed"},
           {json{{"input", {1, 2, "x"}}}, "token id"},
           {json{{"input", "hi"}, {"encoding_format", "hex"}}, "base64"},
           {json{{"input", "hi"}, {"dimensions", 65}}, "64 dimensions"},
           {json{{"input", "hi"}, {"truncate", true}}, "truncate"},
           {json{{"input", long_text}}, "context length"},
           {json{{"input", {{1, 9999}}}}, "outside the vocabulary"},
           {json{{"model", "other"}, {"input", "hi"}}, "does not exist"}}) {
    const auto [status, text] = status_and_body(*server_, "/v1/embeddings", body);
    EXPECT_EQ(status, body.contains("model") ? 404 : 400) << body.dump() << ": " << text;
    EXPECT_NE(text.find(says), std::string::npos) << body.dump() << ": " << text;
  }
  // A model that declares no pooling makes no embeddings.
  const auto generating = start({.host = "127.0.0.1", .port = 0});
  for (const char* path : {"/v1/embeddings", "/api/embed"}) {
    const auto [status, text] = status_and_body(*generating, path, {{"input", "hi"}});
    EXPECT_EQ(status, 400) << path;
    EXPECT_NE(text.find("no pooling type"), std::string::npos) << text;
  }
  generating->stop();
}

TEST(UnitEmbedding, KeepsAZeroVectorZero) {
  EXPECT_EQ(unit_embedding({0.0f, 0.0f, 0.0f}, std::nullopt), (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(unit_embedding({3.0f, 4.0f, 12.0f}, 2), (std::vector<float>{0.6f, 0.8f}));
}

}  // namespace
}  // namespace strata::api
