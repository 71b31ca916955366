// Chat prompts: the model's own Jinja2 template (the GGUF's tokenizer.chat_template, or one
// given to serve) when there is one; without one, ChatML.
#pragma once

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

// A model's own chat template, rendered as Hugging Face's apply_chat_template renders it, with the
// generation prompt on.
class ModelChatTemplate {
 public:
  // Throws jinja::TemplateError naming the line of what the renderer does not support.
  explicit ModelChatTemplate(std::string_view source);

  // Markers the template writes become their tokens; the same text in a message's content stays
  // text. BOS is added as chatml_prompt_tokens adds it. Throws ApiError: 400 with the template's
  // message when it refuses the conversation (raise_exception), 500 when the template fails.
  std::vector<engine::Token> prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                           std::span<const ChatMessage> messages) const;

 private:
  jinja::Template template_;
};

// Prompt tokens for a raw completion prompt; the client owns the whole text, so special tokens in
// it are parsed.
std::vector<engine::Token> completion_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                                    std::string_view prompt);

}  // namespace strata::api
