// A request that outlives its scheduler: a node that enters a request at the leader (or at
// itself, leading) hands the scheduler these callbacks, and when the scheduler is lost mid-way
// (its node was lost, or no longer leads) the request goes on at the next one from the tokens it
// has, with the same text, and with its state when the old one passed it on.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "engine/generator.h"

namespace strata::cluster {

// Where the rest of a request goes: Generator::submit's contract.
using Resubmit = std::function<bool(engine::GenerationRequest, engine::RequestCallbacks)>;

// Callbacks that pass everything on to `client` except such a loss; then the rest of `request`
// goes to `resubmit`, with callbacks of this kind again, and `log` says so. `cached_tokens`: what
// the first scheduler said of the prompt's cache, which the client keeps being told.
engine::RequestCallbacks resumable(const engine::GenerationRequest& request, engine::RequestCallbacks client,
                                   const Resubmit& resubmit, const std::function<void(const std::string&)>& log,
                                   std::optional<int> cached_tokens = std::nullopt);

}  // namespace strata::cluster
