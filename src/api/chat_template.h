// Chat prompts: the model's own Jinja2 template (the GGUF's tokenizer.chat_template, or one
// given to serve) when there is one; without one, ChatML.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/request.h"
#include "engine/generator.h"
#include "template/jinja.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::api {

struct PromptPiece {
  enum class Kind {
    Special,  // a template marker: its own token when the vocabulary has it
    Text,     // template text
    Content,  // what a client wrote: never parsed for special tokens
  };
  Kind kind;
  std::string text;
};

// ChatML, for a model without a template of its own; its markers are plain text when the
// vocabulary lacks them. Ends with the assistant's turn opened, ready for generation.
std::vector<PromptPiece> render_chatml(std::span<const ChatMessage> messages);

// Prompt tokens for a chat in ChatML. BOS is added once: only when the vocabulary wants it.
std::vector<engine::Token> chatml_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages);

struct ChatPrompt {
  std::vector<engine::Token> tokens;
  bool opens_reasoning = false;  // it ends inside an open <think>: the output starts in reasoning
};

// A model's own chat template, rendered as Hugging Face's apply_chat_template renders it, with the
// generation prompt on: the messages as objects (a tool call's arguments as the object its JSON
// text holds), the tools, and the request's template variables (enable_thinking, ...).
class ModelChatTemplate {
 public:
  // `tool_use_source`: the GGUF's tokenizer.chat_template.tool_use, which renders requests that
  // offer tools; empty when the model has none. Throws jinja::TemplateError naming the line of
  // what the renderer does not support.
  explicit ModelChatTemplate(std::string_view source, std::string_view tool_use_source = {});

  // Markers the template writes become their tokens; the same text in a message's content stays
  // text. BOS is added as chatml_prompt_tokens adds it. Throws ApiError: 400 with the template's
  // message when it refuses the conversation (raise_exception), 500 when the template fails.
  ChatPrompt prompt(const tokenizer::Tokenizer& tokenizer, const CompletionRequest& request) const;

  // How the model writes tool calls and reasoning, from its templates' text.
  chat::Family family() const { return family_; }
  bool think_tags() const { return think_tags_; }

 private:
  jinja::Template template_;
  std::optional<jinja::Template> tool_use_template_;
  chat::Family family_;
  bool think_tags_;
};

// Prompt tokens for a raw completion prompt; the client owns the whole text, so special tokens in
// it are parsed.
std::vector<engine::Token> completion_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                                    std::string_view prompt);

}  // namespace strata::api
