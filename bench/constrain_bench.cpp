// The cost of constrained decoding on a real vocabulary: building the vocabulary's index (once
// per tokenizer), preparing a typical JSON schema (compile, read, first mask), the mask per step
// along a valid instance's tokens, and decode speed with and without the schema through the
// whole-model engine. Random weights of a real shape serve for the decode (`strata gguf synth`);
// since their vocabulary is made up, the masks come from VOCAB.gguf's tokenizer (e.g. Qwen3's,
// which tests/tokenizer's reference test writes into the build tree), padded with tokens that
// are never allowed up to the model's vocabulary size.
//   constrain_bench MODEL.gguf VOCAB.gguf [decode tokens] [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include "constrain/json_schema.h"
#include "constrain/matcher.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
    "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                "country": {"enum": ["NO", "SE", "DK", "FI"]}}, "required": ["city", "country"]},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "tags", "address", "active"]
})";

const char* kInstance =
    R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["mathematics", "poetry", "engines"], )"
    R"("address": {"street": "St James's Square 12", "city": "London", "country": "NO"}, "active": true})";

struct Decode {
  int tokens = 0;
  double seconds = 0;  // from the first token to the last
};

Decode decode(engine::Engine& engine, const std::vector<engine::Token>& prompt, int max_tokens, const std::string& grammar) {
  engine::GenerationRequest request;
  request.prompt = prompt;
  request.max_tokens = max_tokens;
  request.sampling.temperature = 0.8f;
  request.sampling.seed = 1;
  request.grammar = grammar;
  auto done = std::make_shared<std::promise<Decode>>();
  auto result = std::make_shared<Decode>();
  auto first = std::make_shared<Clock::time_point>();
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [result, first](const engine::GeneratedToken&) {
    if (result->tokens++ == 0) *first = Clock::now();
    return true;
  };
  callbacks.on_finish = [done, result, first](engine::FinishReason, const std::string& error) {
    if (!error.empty()) std::fprintf(stderr, "constrain_bench: %s\n", error.c_str());
    result->seconds = std::chrono::duration<double>(Clock::now() - *first).count();
    done->set_value(*result);
  };
  engine.submit(std::move(request), std::move(callbacks));
  return done->get_future().get();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: constrain_bench MODEL.gguf VOCAB.gguf [decode tokens] [threads]\n");
    return 2;
  }
  const int decode_tokens = argc > 3 ? std::stoi(argv[3]) : 64;
  const int threads = argc > 4 ? std::stoi(argv[4]) : 0;
  const auto file = std::shared_ptr<const gguf::File>(gguf::File::open(argv[1]));
  const auto model_tokenizer = tokenizer::Tokenizer::from_gguf(*file);
  const auto vocab_file = gguf::File::open(argv[2]);
  const auto tokenizer = tokenizer::Tokenizer::from_gguf(*vocab_file);

  auto start = Clock::now();
  const auto real = constrain::Vocabulary::from_tokenizer(*tokenizer);
  std::printf("vocabulary: %d tokens, %zu trie nodes, index built in %.1f ms\n", real->size(), real->trie().byte.size(),
              ms_since(start));
  const std::shared_ptr<model::Model> model = model::Model::load(file);
  if (model->config().vocab_size < real->size()) {
    std::fprintf(stderr, "constrain_bench: the model's vocabulary is smaller than VOCAB's\n");
    return 2;
  }
  std::vector<std::string> pieces;
  for (constrain::Token t = 0; t < real->size(); ++t) pieces.push_back(real->piece(t));
  pieces.resize(static_cast<size_t>(model->config().vocab_size));
  const auto vocabulary = std::make_shared<const constrain::Vocabulary>(std::move(pieces), real->end_tokens());

  const auto schema = nlohmann::ordered_json::parse(kSchema);
  std::vector<double> compile_ms, prepare_ms;
  std::string grammar;
  for (int i = 0; i < 21; ++i) {
    start = Clock::now();
    grammar = constrain::json_schema_grammar(schema);
    constrain::Matcher matcher(constrain::parse_gbnf(grammar), vocabulary);
    compile_ms.push_back(ms_since(start));
    matcher.allowed_tokens();
    prepare_ms.push_back(ms_since(start));
  }
  std::printf("typical schema: compile + read %.2f ms, + first mask %.2f ms (medians of 21)\n", median(compile_ms),
              median(prepare_ms));

  // Mask per step along a valid instance, as a request meets each position the first time.
  const std::vector<tokenizer::Token> instance = tokenizer->encode(kInstance, false, false);
  std::vector<double> step_ms;
  for (int run = 0; run < 5; ++run) {
    constrain::Matcher matcher(constrain::parse_gbnf(grammar), vocabulary);
    for (tokenizer::Token t : instance) {
      start = Clock::now();
      const std::vector<uint8_t>& allowed = matcher.allowed_tokens();
      step_ms.push_back(ms_since(start));
      if (allowed[static_cast<size_t>(t)] == 0 || !matcher.accept_token(t)) {
        std::fprintf(stderr, "constrain_bench: the instance's token %d ('%s') is not allowed\n", t,
                     tokenizer->token_piece(t).c_str());
        return 1;
      }
    }
  }
  double total = 0;
  for (double ms : step_ms) total += ms;
  std::printf("mask along the instance (%zu tokens, 5 runs): mean %.3f ms, median %.3f ms, max %.3f ms per step\n",
              instance.size(), total / static_cast<double>(step_ms.size()), median(step_ms),
              *std::max_element(step_ms.begin(), step_ms.end()));

  engine::EngineOptions options{.max_parallel = 1, .threads = threads};
  options.vocabulary = vocabulary;
  engine::Engine engine(model, [&vocabulary](engine::Token t) { return vocabulary->is_end(t); }, options);
  const std::vector<engine::Token> prompt = model_tokenizer->encode("Describe a person as JSON:", true, false);
  decode(engine, prompt, 8, "");  // warm up
  for (int round = 0; round < 3; ++round) {
    for (const std::string& g : {std::string(), grammar}) {
      const Decode d = decode(engine, prompt, decode_tokens, g);
      std::printf("decode %-13s %3d tokens, %.2f tokens/s\n", g.empty() ? "unconstrained" : "json_schema", d.tokens,
                  (d.tokens - 1) / d.seconds);
    }
  }
  return 0;
}
