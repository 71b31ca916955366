#include "api/tool_choice_grammar.h"

#include <vector>

#include "api/api_error.h"
#include "constrain/json_schema.h"

namespace strata::api {

std::string required_call_grammar(const CompletionRequest& request, chat::Family family, bool opens_reasoning) {
  const ToolChoice& choice = request.tool_choice;
  if (choice.mode != ToolChoice::Mode::Required && choice.mode != ToolChoice::Mode::Function) return {};
  if (!request.grammar.empty()) {
    throw ApiError(400, "A required tool call cannot be combined with 'response_format' or 'grammar'.",
                   "tool_choice", "invalid_value");
  }
  std::vector<constrain::WrappedSchema> calls;
  for (const auto& tool : request.tools) {
    const auto& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (choice.mode == ToolChoice::Mode::Function && name != choice.function) continue;
    const auto wrapper = chat::required_call_wrapper(family, name);
    if (!wrapper) {
      throw ApiError(400,
                     "This model's chat template writes tool calls in a form that cannot be constrained to "
                     "a schema (none known, or arguments that are not JSON); use tool_choice \"auto\".",
                     "tool_choice", "unsupported_parameter");
    }
    // A model that was left inside its reasoning closes it before the call.
    const std::string reasoning_end = opens_reasoning ? "</think>\n\n" : "";
    calls.push_back({reasoning_end + wrapper->before,
                     function.contains("parameters") ? function["parameters"] : nlohmann::ordered_json{{"type", "object"}},
                     wrapper->after});
  }
  try {
    return constrain::wrapped_json_grammar(calls);
  } catch (const constrain::SchemaError& error) {
    throw ApiError(400, std::string("A tool's parameters cannot be enforced: ") + error.what(), "tools",
                   "invalid_value");
  }
}

}  // namespace strata::api
