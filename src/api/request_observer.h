// What the API records of the requests that enter at this node: in the process's metrics
// registry (see docs/API.md#metrics for the names) answers by endpoint and status and each
// generation's tokens and latencies; a log line for each generation; and the last few
// generations' timelines for the dashboard.
#pragma once

#include <functional>
#include <string>

#include "engine/generator.h"

namespace strata::api {

// One HTTP answer, by the route it reached (its path pattern, or "other") and its status.
void count_answer(const std::string& endpoint, int status);

// Callbacks that pass everything on to `inner`, and count the request's prompt and cached
// tokens (at its first token), its generated tokens, and time its first token, the gaps between
// the later ones and its end, from now; at its end they write one line about it to `log`.
engine::RequestCallbacks observed(engine::RequestCallbacks inner, int prompt_tokens, const std::string& request_id,
                                  std::function<void(const std::string&)> log);

// GET /requests: the generations that entered at this node most recently (up to 50, newest
// first), ended or running, as JSON: {"requests": [{"id", "started_unix_ms", "prompt_tokens",
// "cached_tokens", "generated_tokens", "first_token_seconds" (null before it), "seconds" (so
// far, or in all once ended), "finish" (null while it runs), "queued_seconds" (its wait in the
// queue, this node's scheduler's or the leader's it was relayed to; null until it leaves it)}]}.
std::string recent_requests_json();

}  // namespace strata::api
