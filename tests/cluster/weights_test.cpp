// Weights from peers, without a network: which tensors a range needs, the partial file and its
// list of verified tensors across restarts, and fetches from sources that fail or corrupt.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "cluster/node.h"
#include "cluster/weights.h"

namespace strata::cluster {
namespace {

namespace fs = std::filesystem;

const std::string kDreams = STRATA_SHARED_DIR "/models/aidreams260K.gguf";

class WeightsTest : public ::testing::Test {
 protected:
  WeightsTest()
      : original_(gguf::File::open(kDreams)),
        manifest_(make_manifest(*original_, model_hash(*original_), 2)),
        dir_(fs::temp_directory_path() /
             ("strata-weights-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::remove_all(dir_);
  }
  ~WeightsTest() override { fs::remove_all(dir_); }

  std::shared_ptr<PartialModel> open() { return PartialModel::open(dir_.string(), manifest_); }

  std::span<const uint8_t> original_bytes(size_t tensor) const {
    const gguf::TensorInfo& t = original_->tensors()[tensor];
    return {original_->tensor_data(t), t.size_bytes};
  }

  std::vector<size_t> all_tensors() const {
    std::vector<size_t> all(original_->tensors().size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }

  fs::path verified_list() const { return dir_ / "models" / manifest_.model_hash() / "verified"; }

  std::unique_ptr<gguf::File> original_;
  rpc::ModelManifestReply manifest_;
  fs::path dir_;
};

// Serves the original file's tensors in chunks of 1000 bytes; `corrupt` flips a byte of the
// second chunk, `broken` fails after the first.
class FakeSource final : public TensorSource {
 public:
  enum class Kind { Good, Corrupt, Broken };
  FakeSource(const gguf::File& file, Kind kind, std::string name) : file_(file), kind_(kind), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string fetch(uint32_t tensor, const std::function<bool(uint64_t, std::span<const uint8_t>)>& chunk) override {
    ++calls;
    const gguf::TensorInfo& t = file_.tensors()[tensor];
    std::vector<uint8_t> bytes(file_.tensor_data(t), file_.tensor_data(t) + t.size_bytes);
    if (kind_ == Kind::Corrupt) bytes.at(std::min<size_t>(1500, bytes.size() - 1)) ^= 0x40;
    for (uint64_t offset = 0; offset < bytes.size(); offset += 1000) {
      if (kind_ == Kind::Broken && offset > 0) return "connection reset";
      const uint64_t length = std::min<uint64_t>(1000, bytes.size() - offset);
      if (!chunk(offset, {bytes.data() + offset, length})) return "stopped";
    }
    return {};
  }
  int calls = 0;

 private:
  const gguf::File& file_;
  Kind kind_;
  std::string name_;
};

TEST_F(WeightsTest, ARangeNeedsItsLayersAndTheEmbeddingOrHeadWhereItHasThem) {
  const auto names = [&](model::LayerRange range) {
    std::set<std::string> out;
    for (size_t i : tensors_for(*original_, range)) out.insert(original_->tensors()[i].name);
    return out;
  };
  const std::set<std::string> first = names({0, 1});
  EXPECT_TRUE(first.contains("token_embd.weight"));
  EXPECT_TRUE(first.contains("blk.0.attn_q.weight"));
  EXPECT_FALSE(first.contains("blk.1.attn_q.weight"));
  EXPECT_FALSE(first.contains("output_norm.weight"));
  const std::set<std::string> last = names({3, 4});
  EXPECT_TRUE(last.contains("output.weight"));
  EXPECT_FALSE(last.contains("token_embd.weight")) << "the model's head has a matrix of its own";
  EXPECT_TRUE(last.contains("output_norm.weight"));
  EXPECT_TRUE(last.contains("blk.3.ffn_down.weight"));
  EXPECT_FALSE(last.contains("blk.2.ffn_down.weight"));
  EXPECT_FALSE(names({1, 3}).contains("token_embd.weight"));
  EXPECT_EQ(tensors_for(*original_, {0, 4}).size(), original_->tensors().size());
}

TEST_F(WeightsTest, APartialFileHasTheWholeHeaderAndHolesAndKeepsWhatWasVerified) {
  const size_t tensor = 3;
  {
    const std::shared_ptr<PartialModel> model = open();
    EXPECT_EQ(model->file()->header_bytes().size(), original_->header_bytes().size());
    EXPECT_EQ(model->file()->file_size(), original_->file_size());
    EXPECT_EQ(model_hash(*model->file()), manifest_.model_hash());
    EXPECT_FALSE(model->holds(tensor));
    PartialModel::Writer writer = model->writer(tensor);
    const std::span<const uint8_t> bytes = original_bytes(tensor);
    writer.write(0, bytes.first(100));
    writer.write(100, bytes.subspan(100));
    writer.commit();
    EXPECT_TRUE(model->holds(tensor));
    // The mapping shows what was written.
    const gguf::TensorInfo& t = model->file()->tensors()[tensor];
    EXPECT_EQ(std::memcmp(model->file()->tensor_data(t), bytes.data(), bytes.size()), 0);
  }
  const std::shared_ptr<PartialModel> again = open();
  EXPECT_TRUE(again->holds(tensor));
  EXPECT_FALSE(again->holds(tensor + 1));
  EXPECT_FALSE(again->complete());
}

TEST_F(WeightsTest, BytesThatDoNotMatchTheHashAreRefused) {
  const std::shared_ptr<PartialModel> model = open();
  std::vector<uint8_t> bytes(original_bytes(0).begin(), original_bytes(0).end());
  bytes[bytes.size() / 2] ^= 1;
  PartialModel::Writer writer = model->writer(0);
  writer.write(0, bytes);
  EXPECT_THROW(writer.commit(), std::runtime_error);
  EXPECT_FALSE(model->holds(0));
  PartialModel::Writer short_writer = model->writer(0);
  short_writer.write(0, original_bytes(0).first(10));
  EXPECT_THROW(short_writer.commit(), std::runtime_error);
  PartialModel::Writer gap = model->writer(0);
  EXPECT_THROW(gap.write(10, original_bytes(0).subspan(10)), std::runtime_error);
  EXPECT_FALSE(open()->holds(0));
}

TEST_F(WeightsTest, OnlyWholeLinesWithTheManifestsHashCount) {
  std::string text;
  const auto hash_hex = [&](int i) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : manifest_.tensor_sha256(i)) out += std::string{kDigits[c >> 4], kDigits[c & 15]};
    return out;
  };
  text += "0 " + hash_hex(0) + "\n";             // counts
  text += "1 " + hash_hex(2) + "\n";             // another tensor's hash
  text += "99999 " + hash_hex(0) + "\n";         // no such tensor
  text += "x2 " + hash_hex(2) + "\n";            // not a number
  text += "garbage\n\n";
  text += "4 " + hash_hex(4) + "\n";             // counts
  text += "5 " + hash_hex(5);                    // cut short by a crash
  const std::vector<bool> held = parse_verified(text, manifest_);
  ASSERT_EQ(held.size(), original_->tensors().size());
  for (size_t i = 0; i < held.size(); ++i) EXPECT_EQ(held[i], i == 0 || i == 4) << i;
}

TEST_F(WeightsTest, ARestartAfterACrashMidLineResumes) {
  {
    const std::shared_ptr<PartialModel> model = open();
    PartialModel::Writer writer = model->writer(1);
    writer.write(0, original_bytes(1));
    writer.commit();
  }
  std::ofstream(verified_list(), std::ios::app) << "2 0123";  // a line cut short
  {
    const std::shared_ptr<PartialModel> model = open();
    EXPECT_TRUE(model->holds(1));
    EXPECT_FALSE(model->holds(2));
    PartialModel::Writer writer = model->writer(2);
    writer.write(0, original_bytes(2));
    writer.commit();
  }
  const std::shared_ptr<PartialModel> model = open();
  EXPECT_TRUE(model->holds(1));
  EXPECT_TRUE(model->holds(2));
}

TEST_F(WeightsTest, AManifestWhoseHeaderIsNotTheModelsIsRefused) {
  rpc::ModelManifestReply forged = manifest_;
  forged.mutable_header()->at(40) ^= 1;
  EXPECT_THROW(PartialModel::open(dir_.string(), forged), std::runtime_error);
  rpc::ModelManifestReply short_hashes = manifest_;
  short_hashes.mutable_tensor_sha256()->RemoveLast();
  EXPECT_THROW(PartialModel::open(dir_.string(), short_hashes), std::runtime_error);
}

TEST_F(WeightsTest, ACorruptedOrBrokenTransferIsFetchedAgainFromAnotherSource) {
  const std::shared_ptr<PartialModel> model = open();
  auto corrupt = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Corrupt, "corrupt");
  auto broken = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Broken, "broken");
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  std::vector<std::string> log;
  std::mutex log_mutex;
  FetchOptions options;
  options.log = [&](const std::string& line) {
    std::lock_guard lock(log_mutex);
    log.push_back(line);
  };
  TransferStats stats;
  const std::vector<size_t> all = all_tensors();
  fetch_tensors(*model, all, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{corrupt, broken, good}; },
                options, stats);
  EXPECT_TRUE(model->complete());
  for (size_t i : all) {
    const gguf::TensorInfo& t = model->file()->tensors()[i];
    ASSERT_EQ(std::memcmp(model->file()->tensor_data(t), original_bytes(i).data(), t.size_bytes), 0) << t.name;
  }
  EXPECT_GT(corrupt->calls, 0);
  EXPECT_GT(broken->calls, 0);
  EXPECT_FALSE(log.empty());
  uint64_t file_bytes = 0;
  for (size_t i : all) file_bytes += original_bytes(i).size();
  EXPECT_GT(stats.snapshot().received_bytes, file_bytes) << "refused bytes were received too";
}

TEST_F(WeightsTest, TensorsAreSpreadOverTheSourcesThatHoldThem) {
  const std::shared_ptr<PartialModel> model = open();
  auto first = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "first");
  auto second = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "second");
  TransferStats stats;
  const std::vector<size_t> all = all_tensors();
  fetch_tensors(*model, all, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{first, second}; },
                FetchOptions{}, stats);
  EXPECT_EQ(first->calls + second->calls, static_cast<int>(all.size()));
  EXPECT_EQ(first->calls, static_cast<int>((all.size() + 1) / 2));
}

TEST_F(WeightsTest, AFetchFailsWhenNoSourceGivesGoodBytes) {
  const std::shared_ptr<PartialModel> model = open();
  auto corrupt = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Corrupt, "corrupt");
  TransferStats stats;
  const std::vector<size_t> some{0, 1};
  EXPECT_THROW(fetch_tensors(*model, some, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{corrupt}; },
                             FetchOptions{}, stats),
               std::runtime_error);
  EXPECT_THROW(fetch_tensors(*model, some, [](size_t) { return std::vector<std::shared_ptr<TensorSource>>{}; },
                             FetchOptions{}, stats),
               std::runtime_error);
  EXPECT_FALSE(model->holds(0));
}

TEST_F(WeightsTest, ASecondFetchTakesOnlyWhatTheFirstLacked) {
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  const auto from_good = [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; };
  const std::vector<size_t> all = all_tensors();
  const std::vector<size_t> half(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2));
  uint64_t half_bytes = 0, all_bytes = 0;
  for (size_t i : all) (i < half.size() ? half_bytes : all_bytes) += original_bytes(i).size();
  all_bytes += half_bytes;
  {
    TransferStats stats;
    fetch_tensors(*open(), half, from_good, FetchOptions{}, stats);
    EXPECT_EQ(stats.snapshot().received_bytes, half_bytes);
  }
  TransferStats stats;
  const std::shared_ptr<PartialModel> model = open();
  fetch_tensors(*model, all, from_good, FetchOptions{}, stats);
  EXPECT_EQ(stats.snapshot().received_bytes, all_bytes - half_bytes);
  EXPECT_TRUE(model->complete());
  EXPECT_TRUE(model->held().whole_file());
}

TEST_F(WeightsTest, HeldWeightsCountWholeLayersAndTheHead) {
  const std::shared_ptr<PartialModel> model = open();
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  fetch_tensors(*model, tensors_for(*original_, {3, 4}), [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; },
                FetchOptions{}, stats);
  const rpc::Weights held = model->held();
  const ModelFootprint footprint = footprint_of(*original_);
  EXPECT_FALSE(held.whole_file());
  ASSERT_EQ(held.layer_bytes_size(), 4);
  EXPECT_EQ(held.layer_bytes(0), 0u);
  EXPECT_EQ(held.layer_bytes(3), footprint.layer_weight_bytes[3]);
  EXPECT_TRUE(held.head());
  EXPECT_FALSE(held.embedding());
}

}  // namespace
}  // namespace strata::cluster
