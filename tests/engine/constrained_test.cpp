// Requests with a grammar: every token keeps the text inside it, the end comes when it is
// whole, and a request resumed elsewhere goes on exactly as it would have.
#include <gtest/gtest.h>

#include <regex>

#include "constrain/matcher.h"
#include "engine/drafter.h"
#include "engine/engine.h"
#include "outcome.h"
#include "tokenizer/tokenizer.h"

namespace strata::engine {
namespace {

class ConstrainedTest : public ::testing::Test {
 protected:
  ConstrainedTest() {
    file_ = std::shared_ptr<const gguf::File>(gguf::File::open(kDreams));
    tokenizer_ = tokenizer::Tokenizer::from_gguf(*file_);
  }

  void start(bool with_vocabulary, std::shared_ptr<const Drafter> drafter = nullptr) {
    EngineOptions options{.max_parallel = 3, .drafter = std::move(drafter), .draft_max = 6};
    if (with_vocabulary) options.vocabulary = constrain::Vocabulary::from_tokenizer(*tokenizer_);
    const tokenizer::Tokenizer* tok = tokenizer_.get();
    engine_ = std::make_unique<Engine>(model::Model::load(file_), [tok](Token t) { return tok->is_end_of_generation(t); },
                                       options);
  }

  GenerationRequest request(const std::string& grammar, float temperature, uint64_t seed, int max_tokens = 100) const {
    GenerationRequest r;
    r.prompt = tokenizer_->encode("Once upon a time", true, false);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.grammar = grammar;
    return r;
  }

  std::string text(const std::vector<Token>& tokens) const {
    std::string out;
    for (Token t : tokens) out += tokenizer_->token_piece(t);
    return out;
  }

  Outcome run(GenerationRequest r) { return submit_for_outcome(*engine_, std::move(r)).get(); }

  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
};

const char* kRecord = R"(root ::= "{\"id\": " [1-9] [0-9]{0,2} ", \"tag\": \"" [a-z ]{1,12} "\"}")";

TEST_F(ConstrainedTest, TheTextFollowsTheGrammarAndStopsWhenWhole) {
  start(true);
  const std::regex record(R"(\{"id": [1-9][0-9]{0,2}, "tag": "[a-z ]{1,12}"\})");
  for (auto [temperature, seed] : {std::pair{0.0f, 1}, {0.8f, 5}, {1.5f, 9}}) {
    const Outcome out = run(request(kRecord, temperature, seed));
    const std::string generated = text(out.tokens);
    EXPECT_EQ(out.reason, FinishReason::Stop) << out.error;
    EXPECT_TRUE(std::regex_match(generated, record)) << generated;
  }
}

TEST_F(ConstrainedTest, AResumedRequestRebuildsItsGrammarStateAndGoesOnTheSame) {
  start(true);
  const std::string grammar = R"(root ::= "\"" [a-z ,]{0,60} "\"")";
  for (float temperature : {0.0f, 0.9f}) {
    const GenerationRequest whole = request(grammar, temperature, 77);
    const Outcome all = run(whole);
    ASSERT_GT(all.tokens.size(), 4u);
    for (size_t k : {size_t{1}, all.tokens.size() / 2, all.tokens.size() - 1}) {
      GenerationRequest rest = whole;
      rest.prompt.insert(rest.prompt.end(), all.tokens.begin(), all.tokens.begin() + static_cast<std::ptrdiff_t>(k));
      rest.max_tokens -= static_cast<int>(k);
      rest.resumed_after = static_cast<int>(k);
      const Outcome resumed = run(rest);
      EXPECT_EQ(resumed.tokens, std::vector<Token>(all.tokens.begin() + static_cast<std::ptrdiff_t>(k), all.tokens.end()))
          << "temperature " << temperature << ", resumed after " << k;
      EXPECT_EQ(resumed.reason, all.reason);
    }
  }
  // Tokens that the grammar never allowed cannot be where a request resumes.
  GenerationRequest wrong = request(grammar, 0.0f, 1);
  wrong.prompt.push_back(tokenizer_->encode("x", false, false).back());
  wrong.resumed_after = 1;
  EXPECT_THROW(engine_->submit(wrong, {}), std::invalid_argument);
}

TEST_F(ConstrainedTest, UnconstrainedRequestsBesideConstrainedOnesAreUnchanged) {
  start(true);
  const Outcome alone = run(request("", 0.9f, 3, 30));
  auto constrained = submit_for_outcome(*engine_, request(kRecord, 0.9f, 4));
  auto beside = submit_for_outcome(*engine_, request("", 0.9f, 3, 30));
  EXPECT_EQ(beside.get(), alone);
  EXPECT_EQ(constrained.get().reason, FinishReason::Stop);
}

// Drafts of a known continuation, spoiled by where they start: its third draft one the grammar
// refuses there, or its second one the grammar allows there but that is not the continuation's
// (the first such token, found with a matcher of its own).
class SpoilingDrafter final : public Drafter {
 public:
  SpoilingDrafter(std::vector<Token> prompt, std::vector<Token> continuation, std::string grammar,
                  std::shared_ptr<const constrain::Vocabulary> vocabulary, Token refused)
      : prompt_(std::move(prompt)), continuation_(std::move(continuation)), grammar_(std::move(grammar)),
        vocabulary_(std::move(vocabulary)), refused_(refused) {}
  std::vector<Token> draft(State*, std::span<const Token> history, int max) const override {
    if (history.size() < prompt_.size()) return {};
    const size_t at = history.size() - prompt_.size();
    std::vector<Token> out;
    for (size_t i = at; i < continuation_.size() && out.size() < static_cast<size_t>(max); ++i) out.push_back(continuation_[i]);
    if (out.size() > 2 && at % 5 == 1) out[2] = refused_;
    if (out.size() > 1 && at % 5 >= 3) {
      constrain::Matcher matcher(constrain::parse_gbnf(grammar_), vocabulary_);
      for (size_t i = 0; i <= at; ++i) EXPECT_TRUE(matcher.accept_token(continuation_[i]));
      const std::vector<uint8_t>& allowed = matcher.allowed_tokens();
      for (Token t = 0; t < static_cast<Token>(allowed.size()); ++t) {
        if (allowed[static_cast<size_t>(t)] != 0 && t != out[1]) {
          out[1] = t;
          break;
        }
      }
    }
    return out;
  }

 private:
  std::vector<Token> prompt_, continuation_;
  std::string grammar_;
  std::shared_ptr<const constrain::Vocabulary> vocabulary_;
  Token refused_;
};

// Drafts for a request with a grammar go with a mask for every row, each as the grammar stands
// after the drafts before it, and stop at the first the grammar refuses: the text is the text of
// one token at a time, greedy and seeded.
TEST_F(ConstrainedTest, DraftsFollowTheGrammarAndGiveTheSameText) {
  const Token refused = tokenizer_->encode("Z", false, false).back();  // nowhere in a record
  const auto vocabulary = constrain::Vocabulary::from_tokenizer(*tokenizer_);
  for (auto [temperature, seed] : {std::pair{0.0f, 1}, {0.8f, 5}}) {
    start(true);
    const GenerationRequest r = request(kRecord, temperature, static_cast<uint64_t>(seed));
    const Outcome want = run(r);
    ASSERT_EQ(want.reason, FinishReason::Stop) << want.error;
    ASSERT_GT(want.tokens.size(), 6u);
    start(true, std::make_shared<SpoilingDrafter>(r.prompt, want.tokens, kRecord, vocabulary, refused));
    const Outcome got = run(r);
    EXPECT_EQ(got.tokens, want.tokens) << "temperature " << temperature;
    EXPECT_EQ(got.reason, want.reason) << got.error;
    const Engine::SpeculationCounts counts = engine_->speculation();
    EXPECT_GT(counts.accepted, 0u) << "temperature " << temperature;
    EXPECT_GT(counts.drafted, counts.accepted) << "some drafts are wrong";
  }
}

TEST_F(ConstrainedTest, BadGrammarsAndMissingVocabularyAreRefused) {
  start(true);
  EXPECT_THROW(engine_->submit(request("root ::= nothing", 0.0f, 1), {}), std::invalid_argument);
  start(false);
  EXPECT_THROW(engine_->submit(request(kRecord, 0.0f, 1), {}), std::invalid_argument);
}

}  // namespace
}  // namespace strata::engine
