// What a request produced, collected from its callbacks, for tests of anything that runs
// requests (the engine, a pipeline of stages).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"

namespace strata::engine {

inline const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

struct Outcome {
  std::vector<Token> tokens;
  std::vector<GeneratedToken> generated;
  FinishReason reason = FinishReason::Error;
  std::string error;
  bool operator==(const Outcome& o) const { return tokens == o.tokens && reason == o.reason; }
  std::vector<float> logprobs() const {
    std::vector<float> out;
    for (const GeneratedToken& t : generated) out.push_back(t.logprob);
    return out;
  }
};

// Submits and returns a future for the outcome; `stop_after` tokens end the request early, and
// so does `cancelled` once it says so.
inline std::future<Outcome> submit_for_outcome(Generator& generator, GenerationRequest request, int stop_after = -1,
                                               std::function<bool()> cancelled = {}) {
  auto promise = std::make_shared<std::promise<Outcome>>();
  auto outcome = std::make_shared<Outcome>();
  RequestCallbacks callbacks;
  callbacks.on_token = [outcome, stop_after](const GeneratedToken& t) {
    outcome->tokens.push_back(t.token);
    outcome->generated.push_back(t);
    return stop_after < 0 || static_cast<int>(outcome->tokens.size()) < stop_after;
  };
  callbacks.cancelled = std::move(cancelled);
  callbacks.on_finish = [promise, outcome](FinishReason reason, const std::string& error) {
    outcome->reason = reason;
    outcome->error = error;
    promise->set_value(*outcome);
  };
  EXPECT_TRUE(generator.submit(std::move(request), std::move(callbacks)));
  return promise->get_future();
}

// Each outcome's finish, tokens, logprobs and top logprobs equal the one it should be.
inline void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].reason, want[i].reason) << what << ", request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].logprobs(), want[i].logprobs()) << what << ", request " << i;
    for (size_t t = 0; t < std::min(got[i].generated.size(), want[i].generated.size()); ++t) {
      ASSERT_EQ(got[i].generated[t].top.size(), want[i].generated[t].top.size());
      for (size_t k = 0; k < got[i].generated[t].top.size(); ++k) {
        EXPECT_EQ(got[i].generated[t].top[k].token, want[i].generated[t].top[k].token) << what << ", request " << i;
        EXPECT_EQ(got[i].generated[t].top[k].logprob, want[i].generated[t].top[k].logprob) << what << ", request " << i;
      }
    }
  }
}

}  // namespace strata::engine
