#include "api/completion_text.h"

#include <gtest/gtest.h>

#include "dreams_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace strata::api {
namespace {

class CompletionTextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = &testing::dreams_tokenizer();
    tokens_ =
        tokenizer_->encode("the little cat dreamed of pixels unfolding like petals", false, false);
    tokenizer::StreamDecoder decoder(*tokenizer_);
    for (auto token : tokens_) pieces_.push_back(decoder.push(token));
    pieces_.back() += decoder.finish();
  }

  static engine::GeneratedToken generated(size_t index) {
    return {tokens_[index], -0.5f, {}, false};
  }
  static std::string full_text() {
    std::string text;
    for (const auto& piece : pieces_) text += piece;
    return text;
  }

  static inline const tokenizer::Tokenizer* tokenizer_ = nullptr;
  static inline std::vector<engine::Token> tokens_;
  static inline std::vector<std::string> pieces_;
};

TEST_F(CompletionTextTest, WithoutStopStringsReleasesEverythingAtOnce) {
  CompletionText text(*tokenizer_, {}, false);
  for (size_t i = 0; i < tokens_.size(); ++i) EXPECT_EQ(text.push(generated(i)).text, pieces_[i]);
  EXPECT_EQ(text.finish().text, "");
  EXPECT_FALSE(text.stopped());
}

TEST_F(CompletionTextTest, HoldsBackWhatCouldStartAStopString) {
  ASSERT_GE(tokens_.size(), 4u);
  ASSERT_GE(pieces_[1].size(), 2u);
  const std::string tail = pieces_[1].substr(pieces_[1].size() - 2);
  CompletionText text(*tokenizer_, {tail + "\x01\x02"}, false);
  EXPECT_EQ(text.push(generated(0)).text, pieces_[0]);
  EXPECT_EQ(text.push(generated(1)).text, pieces_[1].substr(0, pieces_[1].size() - 2));
  EXPECT_EQ(text.push(generated(2)).text, tail + pieces_[2]);
  EXPECT_FALSE(text.stopped());
}

TEST_F(CompletionTextTest, CutsAtAStopStringSpanningTokensAndDropsTheRest) {
  const std::string full = full_text();
  const size_t boundary = pieces_[0].size() + pieces_[1].size();
  const std::string stop = full.substr(boundary - 2, 4);
  CompletionText text(*tokenizer_, {stop}, true);
  TextDelta shown;
  for (size_t i = 0; i < tokens_.size() && !text.stopped(); ++i)
    shown.append(text.push(generated(i)));
  shown.append(text.finish());
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(shown.text, full.substr(0, full.find(stop)));
  // Tokens whose text was partly shown are reported; the rest are not.
  ASSERT_EQ(shown.logprobs.size(), 2u);
  EXPECT_EQ(shown.logprobs[1].text_offset, pieces_[0].size());
  EXPECT_EQ(text.push(generated(3)).text, "");
}

TEST_F(CompletionTextTest, EndOfGenerationTokensAreNotShown) {
  CompletionText text(*tokenizer_, {}, true);
  EXPECT_TRUE(text.push({tokenizer_->eos(), -0.1f, {}, true}).empty());
}

}  // namespace
}  // namespace strata::api

namespace strata::api {
namespace {

// An output parser reads markers that are control tokens, so they can be shown as their text;
// otherwise control tokens show nothing, as before.
TEST_F(CompletionTextTest, ControlTokensAreShownOnlyWhenAsked) {
  const engine::Token bos = tokenizer_->bos();
  ASSERT_TRUE(tokenizer_->is_control(bos));
  const engine::GeneratedToken control{bos, -0.5f, {}, false};
  CompletionText hidden(*tokenizer_, {}, false);
  EXPECT_EQ(hidden.push(control).text, "");
  CompletionText shown(*tokenizer_, {}, false, true);
  EXPECT_EQ(shown.push(generated(0)).text, pieces_[0]);
  EXPECT_EQ(shown.push(control).text, tokenizer_->token_text(bos));
  // An end-of-generation token still ends the text without showing itself.
  EXPECT_EQ(shown.push({tokenizer_->eos(), -0.5f, {}, true}).text, "");
}

}  // namespace
}  // namespace strata::api
