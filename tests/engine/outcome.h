// What a request produced, collected from its callbacks, for tests of anything that runs
// requests (the engine, a pipeline of stages).
#pragma once

#include <gtest/gtest.h>

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

}  // namespace strata::engine
