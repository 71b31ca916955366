#include "cluster/resumable_request.h"

#include <memory>

#include "rpc/remote_generator.h"

namespace strata::cluster {
namespace {

struct Progress {
  engine::GenerationRequest request;  // its prompt grows by each token received
  engine::RequestCallbacks client;
  Resubmit resubmit;
  std::function<void(const std::string&)> log;
  std::optional<int> cached_tokens;  // as the first scheduler said: the prompt's, not a resumption's
  int generated = 0;
  bool ended = false;  // its last token ended the generation
};

// Submits the rest of a request whose scheduler was lost (`error`) or passed it on (`held`).
void resume(Progress& progress, const std::string& error, const std::optional<engine::HeldState>& held) {
  engine::GenerationRequest rest = progress.request;
  rest.max_tokens -= progress.generated;
  if (progress.ended || rest.max_tokens == 0) {  // only the news of its end was lost
    const auto reason = progress.ended ? engine::FinishReason::Stop : engine::FinishReason::Length;
    if (progress.client.on_finish) progress.client.on_finish(reason, {});
    return;
  }
  rest.resumed_after += progress.generated;
  rest.held = held;
  if (progress.log) {
    progress.log(held ? "the leader passed a request on; it goes on at the next one with its state, after " +
                            std::to_string(rest.resumed_after) + " generated tokens"
                      : "the node scheduling a request was lost; it resumes after " +
                            std::to_string(rest.resumed_after) + " generated tokens");
  }
  std::string why = "too many requests are waiting";
  try {
    if (progress.resubmit(rest, resumable(rest, progress.client, progress.resubmit, progress.log,
                                          progress.cached_tokens))) {
      return;
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (progress.client.on_finish) progress.client.on_finish(engine::FinishReason::Error, error + "; " + why);
}

}  // namespace

engine::RequestCallbacks resumable(const engine::GenerationRequest& request, engine::RequestCallbacks client,
                                   const Resubmit& resubmit, const std::function<void(const std::string&)>& log,
                                   std::optional<int> cached_tokens) {
  auto progress = std::make_shared<Progress>(Progress{request, std::move(client), resubmit, log, cached_tokens});
  engine::RequestCallbacks callbacks;
  callbacks.cancelled = progress->client.cancelled;
  callbacks.on_started = progress->client.on_started;
  callbacks.on_embedding = progress->client.on_embedding;
  callbacks.on_token = [progress](const engine::GeneratedToken& token) {
    progress->request.prompt.push_back(token.token);
    ++progress->generated;
    progress->ended = token.end_of_generation;
    if (!progress->cached_tokens) progress->cached_tokens = token.cached_tokens;
    if (!progress->client.on_token) return true;
    if (token.cached_tokens == *progress->cached_tokens) return progress->client.on_token(token);
    engine::GeneratedToken shown = token;
    shown.cached_tokens = *progress->cached_tokens;
    return progress->client.on_token(shown);
  };
  callbacks.on_finish = [progress](engine::FinishReason reason, const std::string& error) {
    if (reason != engine::FinishReason::Lost) {
      if (progress->client.on_finish) progress->client.on_finish(reason, error);
      return;
    }
    resume(*progress, error, std::nullopt);
  };
  callbacks.on_passed_on = [progress](const engine::HeldState& held) {
    resume(*progress, std::string(rpc::kSchedulerLost) + "it no longer leads", held);
  };
  return callbacks;
}

}  // namespace strata::cluster
