// Chat prompts: the model's own Jinja2 template (the GGUF's tokenizer.chat_template, or one
// given to serve) when there is one; without one, the common template families rendered here.
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

enum class TemplateFamily { ChatML, Llama2, Llama3, Mistral, Zephyr, Phi3, Gemma };

// Unknown or empty templates get ChatML, whose markers are plain text when the vocabulary lacks
// them.
TemplateFamily detect_template_family(std::string_view chat_template);

struct PromptPiece {
  enum class Kind {
    Bos,      // the vocabulary's begin-of-sequence token
    Eos,      // the vocabulary's end-of-sequence token
    Special,  // a template marker: its own token when the vocabulary has it
    Text,     // template text
    Content,  // what a client wrote: never parsed for special tokens
  };
  Kind kind;
  std::string text;  // empty for Bos and Eos
};

// Ends with the assistant's turn opened, ready for generation.
std::vector<PromptPiece> render_chat(TemplateFamily family, std::span<const ChatMessage> messages);

// Prompt tokens for a chat. BOS is added once: only when the vocabulary wants it and the template
// did not already start with it.
std::vector<engine::Token> chat_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                              TemplateFamily family,
                                              std::span<const ChatMessage> messages);

// A model's own chat template, rendered as Hugging Face's apply_chat_template renders it, with the
// generation prompt on.
class ModelChatTemplate {
 public:
  // Throws jinja::TemplateError naming the line of what the renderer does not support.
  explicit ModelChatTemplate(std::string_view source);

  // Markers the template writes become their tokens; the same text in a message's content stays
  // text. BOS is added as chat_prompt_tokens adds it. Throws ApiError: 400 with the template's
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
