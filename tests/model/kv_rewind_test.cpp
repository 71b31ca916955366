// A sequence goes back to any position it holds (speculative decoding's rejected drafts go),
// and goes on from there as if it had never gone further; a block in the prefix index, which
// other sequences may hold, is never written again.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "dreams.h"
#include "model/model.h"

namespace strata::model {
namespace {

using testing::kDreams;

class KvRewind : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(std::shared_ptr<const gguf::File>(gguf::File::open(kDreams)));
    for (int i = 0; i < 48; ++i) tokens_.push_back(static_cast<Token>(i == 0 ? 1 : 259 + (i * 37) % 240));
  }

  // Feeds `inputs` to the sequence and records them; returns every input's logits.
  std::vector<float> feed(KvState& kv, std::span<const Token> inputs) {
    const SequenceSlice slice{&kv, static_cast<int>(inputs.size()), SliceOutput::AllLogits};
    std::vector<float> logits = model_->forward({&slice, 1}, inputs, {}, pool_);
    kv.record(inputs);
    return logits;
  }
  // The logits of `tail` after `head`, computed on a sequence of its own that never held more.
  std::vector<float> fresh(std::span<const Token> head, std::span<const Token> tail, KvType type = KvType::F16) {
    auto kv = model_->new_sequence(128, type);
    if (!head.empty()) feed(*kv, head);
    return feed(*kv, tail);
  }
  std::span<const Token> span(size_t from, size_t count) const { return std::span<const Token>(tokens_).subspan(from, count); }

  std::unique_ptr<Model> model_;
  tensor::ThreadPool pool_{1};
  std::vector<Token> tokens_;
};

TEST_F(KvRewind, GoesOnAsIfItHadNeverGoneFurther) {
  const std::vector<Token> other{300, 301, 302, 303, 304, 305, 306, 307};
  // Into a partial block, to a block's end, into a full block (which it copies), to 0 ...
  for (const int to : {37, 32, 22, 16, 5, 0}) {
    auto pool = model_->new_kv_memory({16, 0}, KvType::F16);
    KvState kv(pool, 128);
    feed(kv, span(0, 40));
    kv.rewind(to);
    EXPECT_EQ(kv.size(), to);
    EXPECT_EQ(kv.ids().size(), static_cast<size_t>(to));
    const std::vector<float> got = feed(kv, other);
    auto reference_pool = model_->new_kv_memory({16, 0}, KvType::F16);
    KvState reference(reference_pool, 128);
    if (to > 0) feed(reference, span(0, static_cast<size_t>(to)));
    const std::vector<float> want = feed(reference, other);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "rewound to " << to;
    EXPECT_EQ(pool->full().stats().pinned_blocks, (to + 8 + kKvBlock - 1) / kKvBlock) << "rewound to " << to;
  }
  auto pool = model_->new_kv_memory({16, 0}, KvType::F32);
  KvState kv(pool, 128);
  feed(kv, span(0, 20));
  kv.rewind(20);  // where it is: nothing changes
  EXPECT_EQ(kv.size(), 20);
  EXPECT_THROW(kv.rewind(21), std::logic_error);
  EXPECT_THROW(kv.rewind(-1), std::logic_error);
}

// A sequence whose first two blocks entered the index goes back into the second, which another
// sequence holds: it writes into a copy of its own, and the other sequence, and a third one that
// takes the prefix afterwards, read what the index promised.
TEST_F(KvRewind, NeverWritesIntoABlockOfThePrefixIndex) {
  auto pool = model_->new_kv_memory({16, 0}, KvType::F16);
  KvState first(pool, 128);
  feed(first, span(0, 36));
  KvState second(pool, 128);
  ASSERT_EQ(second.hold_prefix(span(0, 32)), 32);
  EXPECT_EQ(pool->full().stats().pinned_blocks, 3);
  first.rewind(22);
  EXPECT_EQ(pool->full().stats().pinned_blocks, 3) << "the second block copied, the third let go";
  const std::vector<Token> other{400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412};
  const std::vector<float> first_got = feed(first, other);  // fills the copy past position 32
  const std::vector<float> first_want = fresh(span(0, 22), other);
  EXPECT_EQ(std::memcmp(first_got.data(), first_want.data(), first_got.size() * sizeof(float)), 0);

  const std::vector<float> second_got = feed(second, span(32, 16));
  const std::vector<float> second_want = fresh(span(0, 32), span(32, 16));
  EXPECT_EQ(std::memcmp(second_got.data(), second_want.data(), second_got.size() * sizeof(float)), 0)
      << "the shared block was written into";
  KvState third(pool, 128);
  ASSERT_EQ(third.hold_prefix(span(0, 32)), 32) << "the index still holds the original";
  const std::vector<float> third_got = feed(third, span(32, 4));
  const std::vector<float> third_want = fresh(span(0, 32), span(32, 4));
  EXPECT_EQ(std::memcmp(third_got.data(), third_want.data(), third_got.size() * sizeof(float)), 0);
  // The rewound sequence's own blocks enter the index under its new tokens.
  std::vector<Token> own(tokens_.begin(), tokens_.begin() + 22);
  own.insert(own.end(), other.begin(), other.end());
  KvState fourth(pool, 128);
  EXPECT_EQ(fourth.hold_prefix(own), 32);
}

// On a full pool: a block that only the rewound sequence holds leaves the index and is written
// in place; one that another sequence holds cannot be copied, and the rewind fails, leaving
// the sequence at the block's start.
TEST_F(KvRewind, OnAFullPoolTakesItsOwnBlockOutOfTheIndexOrFails) {
  {
    auto pool = model_->new_kv_memory({2, 0}, KvType::F16);
    auto kv = std::make_unique<KvState>(pool, 128);
    feed(*kv, span(0, 32));
    kv->rewind(20);
    const std::vector<float> got = feed(*kv, span(40, 4));
    std::vector<Token> head(tokens_.begin(), tokens_.begin() + 20);
    const std::vector<float> want = fresh(head, span(40, 4));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    kv.reset();
    KvState again(pool, 128);
    EXPECT_EQ(again.hold_prefix(span(0, 32)), 16) << "the second block left the index";
  }
  auto pool = model_->new_kv_memory({3, 0}, KvType::F16);
  auto kv = std::make_unique<KvState>(pool, 128);
  feed(*kv, span(0, 32));
  KvState other(pool, 128);
  ASSERT_EQ(other.hold_prefix(span(0, 32)), 32);
  auto third = std::make_unique<KvState>(pool, 128);
  feed(*third, std::vector<Token>(16, 300));  // the pool's last block
  EXPECT_THROW(kv->rewind(20), KvPoolFull);
  EXPECT_EQ(kv->size(), 16);
  EXPECT_EQ(kv->ids().size(), 16u);
  EXPECT_EQ(pool->full().stats().pinned_blocks, 3) << "the other sequences' blocks";
  kv.reset();
  third.reset();
  const std::vector<float> other_got = feed(other, span(32, 4));
  const std::vector<float> other_want = fresh(span(0, 32), span(32, 4));
  EXPECT_EQ(std::memcmp(other_got.data(), other_want.data(), other_got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace strata::model
