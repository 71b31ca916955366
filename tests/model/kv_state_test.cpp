// A sequence's KV state with sliding-window layers: their blocks leave the pool's hold as the
// window moves, yet every logit keeps its bits; a cached prefix is taken only as far as every
// layer still holds what the next input reads; a window layer's state moves as its window.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "model/model.h"
#include "model/synthetic.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

// gpt-oss-tiny (a window of 12 in its even layers) and gemma3-tiny (a window of 12 in 5 of 6).
const char* const kSlidingShapes[] = {"gpt-oss-tiny", "gemma3-tiny"};

std::shared_ptr<const gguf::File> sliding_model(const std::string& shape) {
  const fs::path path = fs::temp_directory_path() / ("strata_kv_state_test_" + std::to_string(::getpid()) + "_" + shape + ".gguf");
  if (!fs::exists(path)) write_synthetic_model(*find_synthetic_shape(shape), parse_weight_types("F32"), path.string(), 11);
  return gguf::File::open(path.string());
}

class TempModels : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& entry : fs::directory_iterator(fs::temp_directory_path())) {
      if (entry.path().filename().string().rfind("strata_kv_state_test_" + std::to_string(::getpid()) + "_", 0) == 0) {
        fs::remove(entry.path());
      }
    }
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TempModels);

std::vector<Token> tokens(int count, int vocab, int salt = 0) {
  std::vector<Token> out{1};
  for (int i = 1; i < count; ++i) out.push_back(static_cast<Token>((i * 131 + salt * 17 + 5) % (vocab - 3) + 3));
  return out;
}

int blocks_for(int positions) { return (positions + kKvBlock - 1) / kKvBlock; }

::testing::AssertionResult same_bits(std::span<const float> actual, std::span<const float> expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << actual.size() << " floats, not " << expected.size();
  if (std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)) != 0) {
    return ::testing::AssertionFailure() << "the bits differ";
  }
  return ::testing::AssertionSuccess();
}

// Every position's logits of `ids`, in one forward over a sequence with room for them all.
std::vector<float> all_logits(Model& model, std::span<const Token> ids, tensor::ThreadPool& pool,
                              KvType type = KvType::F32) {
  auto kv = model.new_sequence(static_cast<int>(ids.size()), type);
  SequenceSlice slice{kv.get(), static_cast<int>(ids.size()), SliceOutput::AllLogits};
  return model.forward({&slice, 1}, ids, {}, pool);
}

// Feeds `ids` to `kv` in steps of up to `step` inputs, recording them as a stage does, and
// returns each input's logits.
std::vector<float> feed(Model& model, KvState& kv, std::span<const Token> ids, int step, tensor::ThreadPool& pool) {
  std::vector<float> logits;
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(step)) {
    const auto part = ids.subspan(at, std::min(ids.size() - at, static_cast<size_t>(step)));
    SequenceSlice slice{&kv, static_cast<int>(part.size()), SliceOutput::AllLogits};
    const std::vector<float> rows = model.forward({&slice, 1}, part, {}, pool);
    logits.insert(logits.end(), rows.begin(), rows.end());
    kv.record(part);
  }
  return logits;
}

class SlidingWindowKv : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    model_ = Model::load(sliding_model(GetParam()));
    window_ = model_->config().sliding_window;
    ASSERT_GT(window_, 0);
  }
  int vocab() const { return model_->config().vocab_size; }
  std::shared_ptr<KvMemory> memory(int positions, int window_blocks, KvType type = KvType::F32) const {
    return model_->new_kv_memory({blocks_for(positions), window_blocks}, type);
  }

  std::unique_ptr<Model> model_;
  int window_ = 0;
  tensor::ThreadPool pool_{2};
};

INSTANTIATE_TEST_SUITE_P(Shapes, SlidingWindowKv, ::testing::ValuesIn(kSlidingShapes),
                         [](const auto& info) { return std::string(info.param).substr(0, std::string(info.param).find('-')); });

// With a window pool just large enough, the blocks a window has moved past are taken again for
// new positions at once: a block let go too early would be overwritten while still read.
TEST_P(SlidingWindowKv, WindowLayersHoldOnlyTheirWindowAndKeepEveryBit) {
  constexpr int kPositions = 90;
  const auto ids = tokens(kPositions, vocab());
  for (const KvType type : {KvType::F32, KvType::F16}) {
    const std::vector<float> whole = all_logits(*model_, ids, pool_, type);
    for (const int step : {1, 7}) {
      SCOPED_TRACE(std::string(kv_type_name(type)) + ", steps of " + std::to_string(step));
      const int window_blocks = window_blocks_needed(window_, kPositions, step);
      ASSERT_LT(window_blocks, blocks_for(kPositions)) << "the window must be shorter than the sequence";
      auto kv_memory = memory(kPositions, window_blocks, type);
      KvState kv(kv_memory, kPositions);
      EXPECT_TRUE(same_bits(feed(*model_, kv, ids, step, pool_), whole));
      EXPECT_EQ(kv_memory->full().stats().pinned_blocks, blocks_for(kPositions));
      EXPECT_LE(kv_memory->window()->stats().pinned_blocks, window_blocks);
      for (int layer = 0; layer < model_->config().layer_count; ++layer) {
        EXPECT_EQ(kv.first_held(layer) > 0, model_->config().is_sliding(layer)) << "layer " << layer;
      }
    }
  }
}

// A new sequence takes a cached prefix only as far as the window layers still hold the blocks
// that the input after it reads, and then computes the same bits as without the cache.
TEST_P(SlidingWindowKv, APrefixIsTakenOnlyWhereEveryLayerHoldsTheNextInputsWindow) {
  ASSERT_LE(window_, kKvBlock) << "the blocks below assume a window within one block";
  const auto first = tokens(64, vocab(), 1);
  // The second prompt shares the first's two leading blocks, then goes its own way.
  std::vector<Token> second(first.begin(), first.begin() + 2 * kKvBlock);
  for (Token t : tokens(30, vocab(), 2)) second.push_back(t);
  const std::vector<float> fresh = all_logits(*model_, second, pool_);
  const auto tail_of = [&](const std::vector<float>& logits, int from) {
    return std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(from) * vocab(), logits.end());
  };
  // `evicted` of the window pool's cached blocks taken for other use, oldest first.
  for (const int evicted : {0, 1, 2}) {
    SCOPED_TRACE("window blocks evicted: " + std::to_string(evicted));
    // Four window blocks: the first sequence takes them all, so each later one evicts.
    auto kv_memory = memory(128, 4);
    {
      KvState kv(kv_memory, 64);
      feed(*model_, kv, first, kKvBlock, pool_);
    }
    std::vector<int> taken;
    for (int i = 0; i < evicted; ++i) taken.push_back(*kv_memory->window()->allocate());
    KvState kv(kv_memory, 128);
    const int held = kv.hold_prefix(second);
    // Block 0 went first, then block 1: the input at 32 reads block 1 (its window starts at
    // 21), that at 16 block 0 (from 5).
    EXPECT_EQ(held, evicted == 0 ? 32 : evicted == 1 ? 32 : 0);
    EXPECT_EQ(kv_memory->full().stats().pinned_blocks, held / kKvBlock);
    const std::vector<float> rest = feed(*model_, kv, std::span<const Token>(second).subspan(static_cast<size_t>(held)), 5, pool_);
    EXPECT_TRUE(same_bits(rest, tail_of(fresh, held)));
    for (int block : taken) kv_memory->window()->unpin(block);
  }
}

// Every layer's state moves to a fresh sequence elsewhere: the window layers' as their window
// alone, after which both sequences go on with the same bits.
TEST_P(SlidingWindowKv, AWindowLayersStateMovesAsItsWindow) {
  constexpr int kPositions = 64;
  const auto ids = tokens(kPositions + 6, vocab(), 3);
  const std::span<const Token> prompt = std::span<const Token>(ids).first(kPositions);
  const std::span<const Token> next = std::span<const Token>(ids).subspan(kPositions);
  auto here = memory(80, window_blocks_needed(window_, 80, kKvBlock));
  KvState source(here, 80);
  feed(*model_, source, prompt, kKvBlock, pool_);
  auto there = memory(80, window_blocks_needed(window_, 80, kKvBlock));
  KvState moved(there, 80);
  const Config& c = model_->config();
  for (int layer = 0; layer < c.layer_count; ++layer) {
    KvRows keys, values;
    source.read(layer, keys, values);
    const int from = source.first_held(layer);
    EXPECT_EQ(from > 0, c.is_sliding(layer)) << "layer " << layer;
    EXPECT_EQ(keys.elements(), static_cast<size_t>(kPositions - from) * c.kv_head_count * c.head_dim);
    if (c.is_sliding(layer)) {
      EXPECT_THROW(moved.write(layer, kPositions, kPositions, KvRows{keys.type, {}}, KvRows{values.type, {}}, prompt),
                   std::invalid_argument)
          << "no rows of the window the next input reads";
      EXPECT_THROW(moved.write(layer, from + 1, kPositions, keys, values, prompt), std::invalid_argument)
          << "a window that starts inside a block";
    } else {
      EXPECT_THROW(moved.write(layer, kKvBlock, kPositions, keys, values, prompt), std::invalid_argument)
          << "a full-attention layer's rows start at 0";
    }
    moved.write(layer, from, kPositions, keys, values, prompt);
  }
  EXPECT_EQ(there->window()->stats().pinned_blocks, here->window()->stats().pinned_blocks);
  EXPECT_TRUE(same_bits(feed(*model_, moved, next, 1, pool_), feed(*model_, source, next, 1, pool_)));
}

// A stage of window layers only takes a sequence's state over as one with full-attention layers
// does: its full pool's blocks, of no layers, still hold the sequence's place in the prefix index.
TEST_P(SlidingWindowKv, AStateMovesIntoAStageOfWindowLayersOnly) {
  constexpr int kPositions = 64;
  ASSERT_TRUE(model_->config().is_sliding(0));
  const auto prompt = tokens(kPositions, vocab(), 4);
  auto here = memory(80, window_blocks_needed(window_, 80, kKvBlock));
  KvState source(here, 80);
  feed(*model_, source, prompt, kKvBlock, pool_);
  const auto window_layer = Model::load(sliding_model(GetParam()), LayerRange{0, 1});
  auto there = window_layer->new_kv_memory({blocks_for(80), window_blocks_needed(window_, 80, kKvBlock)}, KvType::F32);
  KvState moved(there, 80);
  KvRows keys, values;
  source.read(0, keys, values);
  moved.write(0, source.first_held(0), kPositions, keys, values, prompt);
  EXPECT_EQ(there->full().stats().pinned_blocks, blocks_for(kPositions));
  KvRows moved_keys, moved_values;
  moved.read(0, moved_keys, moved_values);
  EXPECT_EQ(moved_keys.bytes, keys.bytes);
  EXPECT_EQ(moved_values.bytes, values.bytes);
}

// Speculative decoding's rejected drafts go back out of both pools: into a block that entered
// the index, beside a sequence that holds it, the window layers too write only a copy, and both
// sequences go on as if the rewound one had never gone further.
TEST_P(SlidingWindowKv, ARewindIntoAnIndexedBlockCopiesItsWindowBlockToo) {
  const auto ids = tokens(48, vocab(), 5);
  const auto other = tokens(9, vocab(), 6);
  auto kv_memory = memory(128, 8);
  KvState kv(kv_memory, 128);
  feed(*model_, kv, ids, kKvBlock, pool_);
  KvState holder(kv_memory, 128);
  ASSERT_EQ(holder.hold_prefix(ids), 48) << "the window of position 48 is held";
  kv.rewind(40);  // into block 2, which entered the index with its window block beside it
  EXPECT_EQ(kv.size(), 40);
  std::vector<Token> rewound(ids.begin(), ids.begin() + 40);
  rewound.insert(rewound.end(), other.begin(), other.end());
  const std::vector<float> fresh = all_logits(*model_, rewound, pool_);
  EXPECT_TRUE(same_bits(feed(*model_, kv, other, 3, pool_),
                        std::vector<float>(fresh.begin() + 40 * static_cast<std::ptrdiff_t>(vocab()), fresh.end())));
  std::vector<Token> held(ids);
  held.insert(held.end(), other.begin(), other.end());
  const std::vector<float> holder_fresh = all_logits(*model_, held, pool_);
  EXPECT_TRUE(same_bits(feed(*model_, holder, other, 9, pool_),
                        std::vector<float>(holder_fresh.begin() + 48 * static_cast<std::ptrdiff_t>(vocab()), holder_fresh.end())))
      << "the indexed blocks were written into";
}

// A sequence cut back (the engine's stages agreeing on a shorter prefix) keeps whole blocks,
// and only where its window layers still hold the window of the input that follows.
TEST_P(SlidingWindowKv, ACutBackNeedsTheWindowItLeavesTheSequenceAt) {
  const auto ids = tokens(64, vocab(), 4);
  auto kv_memory = memory(64, 4);
  KvState kv(kv_memory, 64);
  feed(*model_, kv, ids, kKvBlock, pool_);
  EXPECT_THROW(kv.truncate(16), std::logic_error) << "the window of the input at 16 is gone";
  EXPECT_THROW(kv.rewind(20), std::logic_error) << "nor can it go back there";
  EXPECT_EQ(kv.size(), 64);
  EXPECT_NO_THROW(kv.truncate(48));
  EXPECT_NO_THROW(kv.truncate(0));
  EXPECT_EQ(kv_memory->window()->stats().pinned_blocks, 0);
  EXPECT_EQ(kv_memory->full().stats().pinned_blocks, 0);
}

}  // namespace
}  // namespace strata::model
