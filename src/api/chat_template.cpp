#include "api/chat_template.h"

#include <ctime>
#include <unordered_map>

#include "api/api_error.h"
#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

using Kind = PromptPiece::Kind;

class PieceWriter {
 public:
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

}  // namespace

std::vector<PromptPiece> render_chatml(std::span<const ChatMessage> messages) {
  PieceWriter out;
  for (const auto& message : messages) {
    out.special("<|im_start|>").text(message.role + "\n").content(message.content);
    out.special("<|im_end|>").text("\n");
  }
  out.special("<|im_start|>").text("assistant\n");
  return out.take();
}

namespace {

std::vector<engine::Token> with_bos_once(const tokenizer::Tokenizer& tokenizer,
                                         std::vector<engine::Token> tokens) {
  if (tokenizer.add_bos_by_default() && tokenizer.bos() >= 0 &&
      (tokens.empty() || tokens.front() != tokenizer.bos())) {
    tokens.insert(tokens.begin(), tokenizer.bos());
  }
  return tokens;
}

// Content reaches the template with each special-token text in it, and each character that could
// be mistaken for a stand-in, replaced by a stand-in: one code point of plane 15's private use
// area, which the template's string operations leave alone. After rendering, the special-token
// texts left are the template's markers and become their tokens; each stand-in becomes again the
// plain text it stands for.
constexpr char32_t kStandInBase = 0xF0000;
constexpr char32_t kStandInEnd = 0xFFFFE;

std::string encode_code_point(char32_t c) {
  std::string out;
  out += static_cast<char>(0xf0 | (c >> 18));
  out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
  out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
  out += static_cast<char>(0x80 | (c & 0x3f));
  return out;
}

// Plane 15 code points are four bytes starting F3 B0..F3 BF.
bool is_stand_in_at(std::string_view text, size_t i) {
  return i + 3 < text.size() && static_cast<unsigned char>(text[i]) == 0xf3 &&
         (static_cast<unsigned char>(text[i + 1]) & 0xf0) == 0xb0;
}

char32_t decode_stand_in(std::string_view text, size_t i) {
  return (static_cast<char32_t>(static_cast<unsigned char>(text[i]) & 0x07) << 18) |
         (static_cast<char32_t>(static_cast<unsigned char>(text[i + 1]) & 0x3f) << 12) |
         (static_cast<char32_t>(static_cast<unsigned char>(text[i + 2]) & 0x3f) << 6) |
         static_cast<char32_t>(static_cast<unsigned char>(text[i + 3]) & 0x3f);
}

class StandIns {
 public:
  explicit StandIns(const tokenizer::Tokenizer& tokenizer) : specials_(tokenizer.special_texts()) {
    for (const auto& text : specials_) first_bytes_[static_cast<unsigned char>(text[0])] = true;
  }

  std::string protect(std::string_view content) {
    std::string out;
    for (size_t i = 0; i < content.size();) {
      if (is_stand_in_at(content, i)) {
        out += stand_in(std::string(content.substr(i, 4)));
        i += 4;
        continue;
      }
      const std::string* special = match(content, i);
      if (special) {
        out += stand_in(*special);
        i += special->size();
      } else {
        out += content[i++];
      }
    }
    return out;
  }

  // As chatml_prompt_tokens: runs of text between markers are tokenized together, without special
  // tokens parsed, so merges work across the seams of template text and content.
  std::vector<engine::Token> tokenize(const tokenizer::Tokenizer& tokenizer,
                                      std::string_view text) const {
    std::vector<engine::Token> tokens;
    std::string run;
    auto flush_run = [&] {
      auto run_tokens = tokenizer.encode(run, false, false);
      tokens.insert(tokens.end(), run_tokens.begin(), run_tokens.end());
      run.clear();
    };
    for (size_t i = 0; i < text.size();) {
      if (is_stand_in_at(text, i)) {
        size_t index = decode_stand_in(text, i) - kStandInBase;
        if (index >= literals_.size())
          throw ApiError(500, "the chat template wrote a private-use character it was not given");
        run += literals_[index];
        i += 4;
        continue;
      }
      const std::string* special = match(text, i);
      if (special) {
        flush_run();
        tokens.push_back(tokenizer.find_token(*special).value());
        i += special->size();
      } else {
        run += text[i++];
      }
    }
    flush_run();
    return tokens;
  }

 private:
  // The longest special-token text at text[i], or null.
  const std::string* match(std::string_view text, size_t i) const {
    if (!first_bytes_[static_cast<unsigned char>(text[i])]) return nullptr;
    for (const auto& special : specials_)
      if (text.substr(i, special.size()) == special) return &special;
    return nullptr;
  }

  std::string stand_in(const std::string& literal) {
    auto [it, added] = indexes_.try_emplace(literal, literals_.size());
    if (added) {
      if (kStandInBase + literals_.size() >= kStandInEnd)
        throw ApiError(400,
                       "the messages hold too many different private-use characters of plane 15");
      literals_.push_back(literal);
    }
    return encode_code_point(kStandInBase + static_cast<char32_t>(it->second));
  }

  std::vector<std::string> specials_;
  bool first_bytes_[256] = {};
  std::vector<std::string> literals_;
  std::unordered_map<std::string, size_t> indexes_;
};

jinja::Template parse_model_template(std::string_view source) {
  try {
    return jinja::Template(source);
  } catch (const jinja::TemplateError& e) {
    throw jinja::TemplateError(std::string("the chat template: ") + e.what() +
                               " (serve --chat-template FILE renders with another)");
  }
}

void refuse_stand_ins(std::string_view source) {
  for (size_t i = 0; i < source.size(); ++i)
    if (is_stand_in_at(source, i))
      throw jinja::TemplateError(
          "the chat template holds characters of Unicode plane 15, which stand in for content");
}

using ordered_json = nlohmann::ordered_json;

// Every string a client wrote, keys too, with its special-token texts replaced by stand-ins.
ordered_json protect_json(StandIns& stand_ins, const ordered_json& value) {
  if (value.is_string()) return stand_ins.protect(value.get<std::string>());
  if (value.is_array()) {
    ordered_json out = ordered_json::array();
    for (const auto& item : value) out.push_back(protect_json(stand_ins, item));
    return out;
  }
  if (value.is_object()) {
    ordered_json out = ordered_json::object();
    for (const auto& [key, item] : value.items()) out[stand_ins.protect(key)] = protect_json(stand_ins, item);
    return out;
  }
  return value;
}

// Templates iterate a call's arguments (`arguments|items`) or write them with tojson, so they get
// the object, as Hugging Face's clients pass it; text that holds no JSON object stays text.
ordered_json template_arguments(StandIns& stand_ins, const std::string& arguments) {
  ordered_json parsed = ordered_json::parse(arguments, nullptr, false);
  if (parsed.is_object()) return protect_json(stand_ins, parsed);
  return stand_ins.protect(arguments);
}

// A message as Hugging Face passes it: only the fields it has, reasoning under both the names
// templates read (reasoning_content: Qwen3, GLM, Kimi, DeepSeek; thinking: gpt-oss, Ministral).
ordered_json template_message(StandIns& stand_ins, const ChatMessage& message) {
  ordered_json out = {{"role", message.role}, {"content", stand_ins.protect(message.content)}};
  if (!message.name.empty()) out["name"] = stand_ins.protect(message.name);
  if (!message.reasoning_content.empty()) {
    out["reasoning_content"] = stand_ins.protect(message.reasoning_content);
    out["thinking"] = out["reasoning_content"];
  }
  if (!message.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& call : message.tool_calls) {
      ordered_json entry = ordered_json::object();
      if (!call.id.empty()) entry["id"] = stand_ins.protect(call.id);
      entry["type"] = "function";
      entry["function"] = {{"name", stand_ins.protect(call.name)},
                           {"arguments", template_arguments(stand_ins, call.arguments)}};
      calls.push_back(std::move(entry));
    }
    out["tool_calls"] = std::move(calls);
  }
  if (!message.tool_call_id.empty()) out["tool_call_id"] = stand_ins.protect(message.tool_call_id);
  return out;
}

}  // namespace

ModelChatTemplate::ModelChatTemplate(std::string_view source, std::string_view tool_use_source)
    : template_(parse_model_template(source)),
      family_(chat::detect_family(tool_use_source.empty() ? source : tool_use_source)),
      think_tags_(chat::uses_think_tags(source) || chat::uses_think_tags(tool_use_source)) {
  refuse_stand_ins(source);
  refuse_stand_ins(tool_use_source);
  if (!tool_use_source.empty()) tool_use_template_.emplace(parse_model_template(tool_use_source));
}

ChatPrompt ModelChatTemplate::prompt(const tokenizer::Tokenizer& tokenizer,
                                     const CompletionRequest& request) const {
  StandIns stand_ins(tokenizer);
  ordered_json context;
  context["messages"] = ordered_json::array();
  for (const auto& message : request.messages)
    context["messages"].push_back(template_message(stand_ins, message));
  // As Hugging Face: `tools` is defined only when tools are offered.
  if (!request.tools.empty()) context["tools"] = protect_json(stand_ins, request.tools);
  for (const auto& [key, value] : request.template_kwargs.items())
    context[key] = protect_json(stand_ins, value);
  context["add_generation_prompt"] = true;
  context["bos_token"] = tokenizer.bos() >= 0 ? tokenizer.token_text(tokenizer.bos()) : "";
  context["eos_token"] = tokenizer.eos() >= 0 ? tokenizer.token_text(tokenizer.eos()) : "";
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const jinja::Template& chosen =
      tool_use_template_ && !request.tools.empty() ? *tool_use_template_ : template_;
  std::string text;
  try {
    text = chosen.render(context, local);
  } catch (const jinja::RaisedError& e) {
    throw ApiError(400,
                   std::string("the model's chat template refuses these messages: ") + e.what(),
                   "messages");
  } catch (const jinja::TemplateError& e) {
    throw ApiError(500, std::string("the model's chat template failed: ") + e.what());
  }
  return {with_bos_once(tokenizer, stand_ins.tokenize(tokenizer, text)), chat::prompt_opens_reasoning(text)};
}

std::vector<engine::Token> chatml_prompt_tokens(const tokenizer::Tokenizer& tokenizer,
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
  for (const auto& piece : render_chatml(messages)) {
    std::optional<engine::Token> marker;
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
