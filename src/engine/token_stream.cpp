#include "engine/token_stream.h"

namespace strata::engine {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Clang before 17 deduces no aggregate's template arguments by itself.
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

bool ends_request(const TokenEvent& event) {
  return std::holds_alternative<RequestFinished>(event) || std::holds_alternative<RequestPassedOn>(event);
}

RequestCallbacks queue_events(std::shared_ptr<TokenStream<TokenEvent>> stream) {
  RequestCallbacks callbacks;
  callbacks.on_token = [stream](const GeneratedToken& token) {
    stream->push(token);
    return !stream->cancelled();
  };
  callbacks.on_finish = [stream](FinishReason reason, const std::string& error) {
    stream->push(RequestFinished{reason, error}, /*last=*/true);
  };
  callbacks.cancelled = [stream] { return stream->cancelled(); };
  callbacks.on_passed_on = [stream](const HeldState& held) { stream->push(RequestPassedOn{held}, /*last=*/true); };
  callbacks.on_started = [stream] { stream->push(RequestStarted{}); };
  callbacks.on_embedding = [stream](std::vector<float> vector) { stream->push(PooledEmbedding{std::move(vector)}); };
  return callbacks;
}

bool deliver(const TokenEvent& event, RequestCallbacks& callbacks, const std::string& passed_on_error) {
  return std::visit(
      Overloaded{
          [&](const RequestStarted&) {
            if (callbacks.on_started) callbacks.on_started();
            return true;
          },
          [&](const GeneratedToken& token) { return callbacks.on_token ? callbacks.on_token(token) : true; },
          [&](const PooledEmbedding& embedding) {
            if (callbacks.on_embedding) callbacks.on_embedding(embedding.vector);
            return true;
          },
          [&](const RequestFinished& finished) {
            if (callbacks.on_finish) callbacks.on_finish(finished.reason, finished.error);
            return true;
          },
          [&](const RequestPassedOn& passed) {
            if (callbacks.on_passed_on) {
              callbacks.on_passed_on(passed.held);
            } else if (callbacks.on_finish) {
              callbacks.on_finish(FinishReason::Lost, passed_on_error);
            }
            return true;
          },
      },
      event);
}

}  // namespace strata::engine
