// tool_choice "required" or a named function, enforced: the grammar that makes the output one
// call, in the model family's syntax, whose arguments match the tool's parameters.
#pragma once

#include <string>

#include "api/request.h"
#include "chat/output_format.h"

namespace strata::api {

// Empty when the request's tool_choice requires no call. Otherwise GBNF (constrain/grammar.h)
// accepting one call of any offered tool ("required") or of the named one, its arguments JSON
// that matches the tool's `parameters` (any object when it has none); after a prompt that opens
// the model's reasoning, the output closes it first. Throws ApiError (400) for a family whose
// calls cannot be constrained (no call syntax known, or arguments that are not JSON), for
// parameters the schema compiler refuses (naming the tool), and beside another grammar.
std::string required_call_grammar(const CompletionRequest& request, chat::Family family, bool opens_reasoning);

}  // namespace strata::api
