#include "api/chat_template.h"

#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

using Kind = PromptPiece::Kind;

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
}

class PieceWriter {
 public:
  PieceWriter& bos() {
    pieces_.push_back({Kind::Bos, {}});
    return *this;
  }
  PieceWriter& eos() {
    pieces_.push_back({Kind::Eos, {}});
    return *this;
  }
  PieceWriter& special(std::string_view text) { return add(Kind::Special, text); }
  PieceWriter& text(std::string_view text) { return add(Kind::Text, text); }
  PieceWriter& content(std::string_view text) { return add(Kind::Content, text); }
  std::vector<PromptPiece> take() { return std::move(pieces_); }

 private:
  PieceWriter& add(Kind kind, std::string_view text) {
    if (!text.empty()) pieces_.push_back({kind, std::string(text)});
    return *this;
  }
  std::vector<PromptPiece> pieces_;
};

// A turn of a template without a system role: system messages ride on the next user turn.
struct Turn {
  bool from_user = true;
  std::string system;
  std::string content;
};

std::vector<Turn> fold_system_messages(std::span<const ChatMessage> messages) {
  std::vector<Turn> turns;
  std::string pending_system;
  for (const auto& message : messages) {
    if (message.role == "system") {
      pending_system += pending_system.empty() ? message.content : "\n\n" + message.content;
    } else if (message.role == "user") {
      turns.push_back({true, std::move(pending_system), message.content});
      pending_system.clear();
    } else {
      turns.push_back({false, {}, message.content});
    }
  }
  if (!pending_system.empty()) turns.push_back({true, std::move(pending_system), {}});
  return turns;
}

void render_chatml(PieceWriter& out, std::span<const ChatMessage> messages) {
  for (const auto& message : messages) {
    out.special("<|im_start|>").text(message.role + "\n").content(message.content);
    out.special("<|im_end|>").text("\n");
  }
  out.special("<|im_start|>").text("assistant\n");
}

void render_llama3(PieceWriter& out, std::span<const ChatMessage> messages) {
  out.bos();
  for (const auto& message : messages) {
    out.special("<|start_header_id|>").text(message.role).special("<|end_header_id|>").text("\n\n");
    out.content(trim(message.content)).special("<|eot_id|>");
  }
  out.special("<|start_header_id|>").text("assistant").special("<|end_header_id|>").text("\n\n");
}

void render_llama2(PieceWriter& out, std::span<const ChatMessage> messages) {
  for (const auto& turn : fold_system_messages(messages)) {
    if (!turn.from_user) {
      out.text(" ").content(trim(turn.content)).text(" ").eos();
      continue;
    }
    out.bos().text("[INST] ");
    if (!turn.system.empty()) {
      out.text("<<SYS>>\n").content(trim(turn.system)).text("\n<</SYS>>\n\n");
    }
    out.content(trim(turn.content)).text(" [/INST]");
  }
}

void render_mistral(PieceWriter& out, std::span<const ChatMessage> messages) {
  out.bos();
  for (const auto& turn : fold_system_messages(messages)) {
    if (!turn.from_user) {
      out.content(turn.content).eos();
      continue;
    }
    out.special("[INST]").text(" ");
    if (!turn.system.empty()) out.content(turn.system).text("\n\n");
    out.content(turn.content).text(" ").special("[/INST]");
  }
}

// Zephyr and Phi-3 share the <|role|> headers and differ in how a turn ends.
void render_role_headers(PieceWriter& out, std::span<const ChatMessage> messages, bool phi3) {
  for (const auto& message : messages) {
    out.special("<|" + message.role + "|>").text("\n").content(message.content);
    (phi3 ? out.special("<|end|>") : out.eos()).text("\n");
  }
  out.special("<|assistant|>").text("\n");
}

void render_gemma(PieceWriter& out, std::span<const ChatMessage> messages) {
  out.bos();
  for (const auto& turn : fold_system_messages(messages)) {
    out.special("<start_of_turn>").text(turn.from_user ? "user\n" : "model\n");
    if (!turn.system.empty()) out.content(trim(turn.system)).text("\n\n");
    out.content(trim(turn.content)).special("<end_of_turn>").text("\n");
  }
  out.special("<start_of_turn>").text("model\n");
}

std::vector<engine::Token> with_bos_once(const tokenizer::Tokenizer& tokenizer,
                                         std::vector<engine::Token> tokens) {
  if (tokenizer.add_bos_by_default() && tokenizer.bos() >= 0 &&
      (tokens.empty() || tokens.front() != tokenizer.bos())) {
    tokens.insert(tokens.begin(), tokenizer.bos());
  }
  return tokens;
}

}  // namespace

TemplateFamily detect_template_family(std::string_view chat_template) {
  auto has = [&](std::string_view marker) {
    return chat_template.find(marker) != std::string_view::npos;
  };
  if (has("<|start_header_id|>")) return TemplateFamily::Llama3;
  if (has("<|im_start|>")) return TemplateFamily::ChatML;
  if (has("<start_of_turn>")) return TemplateFamily::Gemma;
  if (has("<|user|>")) return has("<|end|>") ? TemplateFamily::Phi3 : TemplateFamily::Zephyr;
  if (has("[INST]")) return has("<<SYS>>") ? TemplateFamily::Llama2 : TemplateFamily::Mistral;
  return TemplateFamily::ChatML;
}

std::vector<PromptPiece> render_chat(TemplateFamily family, std::span<const ChatMessage> messages) {
  PieceWriter out;
  switch (family) {
    case TemplateFamily::ChatML:
      render_chatml(out, messages);
      break;
    case TemplateFamily::Llama2:
      render_llama2(out, messages);
      break;
    case TemplateFamily::Llama3:
      render_llama3(out, messages);
      break;
    case TemplateFamily::Mistral:
      render_mistral(out, messages);
      break;
    case TemplateFamily::Zephyr:
      render_role_headers(out, messages, false);
      break;
    case TemplateFamily::Phi3:
      render_role_headers(out, messages, true);
      break;
    case TemplateFamily::Gemma:
      render_gemma(out, messages);
      break;
  }
  return out.take();
}

std::vector<engine::Token> chat_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                              TemplateFamily family,
                                              std::span<const ChatMessage> messages) {
  std::vector<engine::Token> tokens;
  // Text and content between markers are tokenized together, without special-token parsing, so
  // the tokenizer's merges work across their seams and content cannot smuggle in a marker.
  std::string run;
  auto flush_run = [&] {
    if (run.empty()) return;
    auto run_tokens = tokenizer.encode(run, false, false);
    tokens.insert(tokens.end(), run_tokens.begin(), run_tokens.end());
    run.clear();
  };
  for (const auto& piece : render_chat(family, messages)) {
    std::optional<engine::Token> marker;
    if (piece.kind == Kind::Bos && tokenizer.bos() >= 0) marker = tokenizer.bos();
    if (piece.kind == Kind::Eos && tokenizer.eos() >= 0) marker = tokenizer.eos();
    if (piece.kind == Kind::Special) marker = tokenizer.find_token(piece.text);
    if (marker) {
      flush_run();
      tokens.push_back(*marker);
    } else {
      run += piece.text;
    }
  }
  flush_run();
  return with_bos_once(tokenizer, std::move(tokens));
}

std::vector<engine::Token> completion_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
                                                    std::string_view prompt) {
  return with_bos_once(tokenizer, tokenizer.encode(prompt, false, true));
}

}  // namespace strata::api
