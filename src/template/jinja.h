// Jinja2 for chat templates: renders a model's own tokenizer.chat_template the way Hugging Face's
// apply_chat_template renders it with Python's jinja2 (an immutable sandbox, trim_blocks,
// lstrip_blocks, loop controls, the globals raise_exception and strftime_now, and a tojson that
// keeps non-ASCII text), byte for byte. It covers the subset real chat templates use and is
// strict about the rest: a construct outside it is an error when the template is parsed, naming
// its line, rather than output that differs from what the model was trained on.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata::jinja {

// Parse errors name the template line; errors while rendering are those Python would raise.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The template's own raise_exception(message): what() is its message alone.
class RaisedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

struct Program;

class Template {
 public:
  // Throws TemplateError.
  explicit Template(std::string_view source);

  // context: the template's variables (messages, tools, add_generation_prompt, bos_token, ...);
  // now: the local time strftime_now formats. Throws TemplateError.
  std::string render(const nlohmann::ordered_json& context, const std::tm& now) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace strata::jinja
