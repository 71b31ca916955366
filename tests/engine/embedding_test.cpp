// An embedding is its text's rows pooled, and nothing else: the same bits alone or batched with
// other requests, in one prompt step or many, on one stage or split over several; the rows are
// what the output head reads, and generations running beside embeddings are unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <future>

#include "engine/engine.h"
#include "engine/local_stage.h"
#include "outcome.h"

namespace strata::engine {
namespace {

using model::Pooling;

std::shared_ptr<const gguf::File> dreams() { return std::shared_ptr<const gguf::File>(gguf::File::open(kDreams)); }

// BOS, then `length - 1` ordinary tokens that depend on `salt`.
std::vector<Token> text(int length, int salt) {
  std::vector<Token> out{1};
  for (int i = 1; i < length; ++i) out.push_back(static_cast<Token>(259 + (i * 31 + salt * 67) % 250));
  return out;
}

GenerationRequest embedding(std::vector<Token> prompt, Pooling pooling) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.embedding = pooling;
  return r;
}

struct Embedded {
  std::vector<float> vector;
  FinishReason reason = FinishReason::Error;
  std::string error;
};

std::future<Embedded> submit_embedding(Generator& generator, GenerationRequest request) {
  auto promise = std::make_shared<std::promise<Embedded>>();
  auto result = std::make_shared<Embedded>();
  RequestCallbacks callbacks;
  callbacks.on_token = [](const GeneratedToken&) {
    ADD_FAILURE() << "an embedding request generated a token";
    return false;
  };
  callbacks.on_embedding = [result](std::vector<float> v) { result->vector = std::move(v); };
  callbacks.on_finish = [promise, result](FinishReason reason, const std::string& error) {
    result->reason = reason;
    result->error = error;
    promise->set_value(*result);
  };
  EXPECT_TRUE(generator.submit(std::move(request), std::move(callbacks)));
  return promise->get_future();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every input's output-normed row, from one forward pass of the whole model over the text (its
// keys and values kept as F32, as the engines below keep them).
std::vector<float> rows_of(const std::vector<Token>& prompt) {
  auto model = model::Model::load(dreams());
  tensor::ThreadPool pool(1);
  auto kv = model->new_sequence(static_cast<int>(prompt.size()));
  const model::SequenceSlice slice{kv.get(), static_cast<int>(prompt.size()), model::SliceOutput::AllEmbeddings};
  return model->forward({&slice, 1}, prompt, {}, pool);
}

TEST(EmbeddingRows, AreWhatTheOutputHeadReads) {
  const std::vector<Token> prompt = text(9, 1);
  const std::vector<float> rows = rows_of(prompt);
  auto model = model::Model::load(dreams());
  const int dim = model->config().embedding_dim;
  const int vocab = model->config().vocab_size;
  ASSERT_EQ(rows.size(), prompt.size() * static_cast<size_t>(dim));
  tensor::ThreadPool pool(1);
  auto kv = model->new_sequence(static_cast<int>(prompt.size()));
  const model::SequenceSlice slice{kv.get(), static_cast<int>(prompt.size()), model::SliceOutput::AllLogits};
  const std::vector<float> logits = model->forward({&slice, 1}, prompt, {}, pool);
  // The shared model's head is its token embedding (F32, tied): each logit is a dot product.
  const gguf::TensorInfo* head = model->file().find_tensor("token_embd.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_EQ(head->type, 0u) << "F32";
  const auto* weights = reinterpret_cast<const float*>(model->file().tensor_data(*head));
  for (size_t r = 0; r < prompt.size(); ++r) {
    for (int t = 0; t < vocab; t += 37) {
      double dot = 0.0;
      for (int i = 0; i < dim; ++i) dot += double(weights[size_t(t) * dim + i]) * rows[r * dim + size_t(i)];
      EXPECT_NEAR(logits[r * size_t(vocab) + size_t(t)], dot, 1e-4) << "row " << r << " token " << t;
    }
  }
}

TEST(EmbeddingRows, KeepTheirPlaceBesideLogitsInOneBatch) {
  auto model = model::Model::load(dreams());
  const size_t dim = static_cast<size_t>(model->config().embedding_dim);
  const size_t vocab = static_cast<size_t>(model->config().vocab_size);
  const std::vector<Token> a = text(5, 2), b = text(7, 3);
  const std::vector<float> a_rows = rows_of(a);
  tensor::ThreadPool pool(1);
  auto kv_a = model->new_sequence(5), kv_b = model->new_sequence(7), kv_alone = model->new_sequence(7);
  const model::SequenceSlice alone{kv_alone.get(), 7};
  const std::vector<float> b_logits = model->forward({&alone, 1}, b, {}, pool);
  const std::vector<model::SequenceSlice> slices{{kv_b.get(), 7}, {kv_a.get(), 5, model::SliceOutput::AllEmbeddings}};
  std::vector<Token> tokens = b;
  tokens.insert(tokens.end(), a.begin(), a.end());
  const std::vector<float> out = model->forward(slices, tokens, {}, pool);
  ASSERT_EQ(out.size(), vocab + 5 * dim);
  EXPECT_TRUE(same_bits({out.begin(), out.begin() + static_cast<ptrdiff_t>(vocab)}, b_logits));
  EXPECT_TRUE(same_bits({out.begin() + static_cast<ptrdiff_t>(vocab), out.end()}, a_rows));
}

// Pooling as the GGUF's pooling types define it, computed here from the rows.
std::vector<float> pooled(const std::vector<float>& rows, size_t count, size_t dim, Pooling pooling) {
  std::vector<float> out(dim);
  for (size_t i = 0; i < dim; ++i) {
    if (pooling == Pooling::Cls) out[i] = rows[i];
    if (pooling == Pooling::Last) out[i] = rows[(count - 1) * dim + i];
    if (pooling == Pooling::Mean) {
      double sum = 0.0;
      for (size_t r = 0; r < count; ++r) sum += rows[r * dim + i];
      out[i] = static_cast<float>(sum / static_cast<double>(count));
    }
  }
  return out;
}

class EmbeddingEngineTest : public ::testing::TestWithParam<Pooling> {};

TEST_P(EmbeddingEngineTest, PoolsTheModelsRowsWhateverRunsBesideIt) {
  const Pooling pooling = GetParam();
  const std::vector<Token> prompt = text(23, 4);
  const std::vector<float> expected = pooled(rows_of(prompt), prompt.size(), 64, pooling);

  // Alone, its prompt in one step.
  Engine whole(model::Model::load(dreams()), [](Token t) { return t == 2; }, {.max_parallel = 4, .kv_type = model::KvType::F32});
  const Embedded alone = submit_embedding(whole, embedding(prompt, pooling)).get();
  ASSERT_EQ(alone.reason, FinishReason::Stop) << alone.error;
  ASSERT_EQ(alone.vector.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(alone.vector[i], expected[i], 1e-6) << i;

  // In steps of 4 prompt tokens, beside generations and other embeddings.
  Engine chunked(model::Model::load(dreams()), [](Token t) { return t == 2; },
                 {.max_parallel = 6, .prefill_chunk = 4, .kv_type = model::KvType::F32});
  GenerationRequest generation;
  generation.prompt = text(6, 5);
  generation.max_tokens = 20;
  const Outcome generated_alone = submit_for_outcome(whole, generation).get();
  std::vector<std::future<Embedded>> others;
  auto running = submit_for_outcome(chunked, generation);
  for (int i = 0; i < 3; ++i) others.push_back(submit_embedding(chunked, embedding(text(11 + i, 6 + i), pooling)));
  const Embedded batched = submit_embedding(chunked, embedding(prompt, pooling)).get();
  EXPECT_EQ(batched.reason, FinishReason::Stop) << batched.error;
  EXPECT_TRUE(same_bits(batched.vector, alone.vector));
  for (auto& other : others) EXPECT_EQ(other.get().reason, FinishReason::Stop);
  EXPECT_EQ(running.get(), generated_alone) << "a generation beside embeddings is unchanged";

  // Over a pipeline of three stages.
  std::vector<std::unique_ptr<tensor::ThreadPool>> pools;
  std::vector<std::shared_ptr<Stage>> stages;
  for (auto [first, last] : {std::pair{0, 2}, std::pair{2, 3}, std::pair{3, 4}}) {
    pools.push_back(std::make_unique<tensor::ThreadPool>(1));
    stages.push_back(std::make_shared<LocalStage>(model::Model::load(dreams(), model::LayerRange{first, last}),
                                                  *pools.back(), KvOptions{model::KvType::F32, {64}}));
  }
  Engine pipeline(stages, 512, [](Token t) { return t == 2; },
                  {.context_size = 128, .max_parallel = 4, .prefill_chunk = 5, .embedding_dim = 64});
  const Embedded split = submit_embedding(pipeline, embedding(prompt, pooling)).get();
  EXPECT_EQ(split.reason, FinishReason::Stop) << split.error;
  EXPECT_TRUE(same_bits(split.vector, alone.vector));
}

INSTANTIATE_TEST_SUITE_P(Poolings, EmbeddingEngineTest, ::testing::Values(Pooling::Mean, Pooling::Cls, Pooling::Last),
                         [](const auto& info) { return std::string(model::pooling_name(info.param)); });

TEST(EmbeddingEngine, LastPoolingTakesTheCachedPrefixAndGivesTheSameBits) {
  Engine engine(model::Model::load(dreams()), [](Token t) { return t == 2; },
                {.max_parallel = 2, .kv_type = model::KvType::F32});
  const std::vector<Token> prompt = text(40, 8);
  const Embedded first = submit_embedding(engine, embedding(prompt, Pooling::Last)).get();
  const Embedded again = submit_embedding(engine, embedding(prompt, Pooling::Last)).get();
  const Embedded mean = submit_embedding(engine, embedding(prompt, Pooling::Mean)).get();
  ASSERT_EQ(first.reason, FinishReason::Stop) << first.error;
  EXPECT_TRUE(same_bits(first.vector, again.vector));
  // A mean over a prefix it did not compute would be off: it computes every row.
  const std::vector<float> expected = pooled(rows_of(prompt), prompt.size(), 64, Pooling::Mean);
  ASSERT_EQ(mean.vector.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(mean.vector[i], expected[i], 1e-6) << i;
}

TEST(EmbeddingEngine, RefusesWhatMakesNoEmbedding) {
  Engine engine(model::Model::load(dreams()), [](Token t) { return t == 2; }, {});
  RequestCallbacks none;
  EXPECT_THROW(engine.submit(embedding(text(5, 1), Pooling::Rank), none), std::invalid_argument);
  GenerationRequest with_grammar = embedding(text(5, 1), Pooling::Mean);
  with_grammar.grammar = "root ::= \"a\"";
  EXPECT_THROW(engine.submit(with_grammar, none), std::invalid_argument);
  EXPECT_THROW(engine.submit(embedding(text(129, 1), Pooling::Mean), none), std::invalid_argument) << "the context";
  // A pipeline not told the rows' width makes none.
  tensor::ThreadPool pool(1);
  std::vector<std::shared_ptr<Stage>> stages{std::make_shared<LocalStage>(
      model::Model::load(dreams()), pool, KvOptions{model::KvType::F32, {16}})};
  Engine pipeline(stages, 512, [](Token t) { return t == 2; }, {.context_size = 128});
  EXPECT_THROW(pipeline.submit(embedding(text(5, 1), Pooling::Mean), none), std::invalid_argument);
}

}  // namespace
}  // namespace strata::engine
