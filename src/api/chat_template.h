// Chat prompts: the common chat-template families recognised from the GGUF template text and
// rendered here, so no Jinja interpreter is needed.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/request.h"
#include "engine/generator.h"

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

// Prompt tokens for a raw completion prompt; the client owns the whole text, so special tokens in
// it are parsed.
std::vector<engine::Token> completion_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                                    std::string_view prompt);

}  // namespace strata::api
