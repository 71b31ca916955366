// Weights from peers, without a network: which tensors a range needs, the partial file and its
// list of verified tensors across restarts, tensors resumed mid-way from their last checkpoint,
// and fetches from sources that fail or corrupt.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "cluster/node.h"
#include "cluster/weights.h"
#include "gguf_variant.h"
#include "model/synthetic.h"

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

  std::shared_ptr<PartialModel> open(uint64_t checkpoint_bytes = kProgressCheckpointBytes) {
    return PartialModel::open(dir_.string(), manifest_, checkpoint_bytes);
  }

  std::span<const uint8_t> original_bytes(size_t tensor) const {
    const gguf::TensorInfo& t = original_->tensors()[tensor];
    return {original_->tensor_data(t), t.size_bytes};
  }

  std::vector<size_t> all_tensors() const {
    std::vector<size_t> all(original_->tensors().size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }

  fs::path verified_list() const { return dir_ / "models" / manifest_.model_hash / "verified"; }
  fs::path progress_record() const { return dir_ / "models" / manifest_.model_hash / "progress"; }

  // The first `count` bytes of `tensor`, in chunks of 1000, as a fetch cut short writes them.
  void write_part(PartialModel& model, size_t tensor, uint64_t count) const {
    PartialModel::Writer writer = model.writer(tensor);
    for (uint64_t offset = writer.written(); offset < count; offset += 1000) {
      writer.write(offset, original_bytes(tensor).subspan(offset, std::min<uint64_t>(1000, count - offset)));
    }
  }

  std::unique_ptr<gguf::File> original_;
  cluster_types::ModelManifest manifest_;
  fs::path dir_;
};

// Serves the original file's tensors from the offset asked for, in chunks of 1000 bytes, and
// records the offsets asked for; `corrupt` flips the tensor's byte 1500, `broken` fails after its
// first chunk.
class FakeSource final : public TensorSource {
 public:
  enum class Kind { Good, Corrupt, Broken };
  FakeSource(const gguf::File& file, Kind kind, std::string name) : file_(file), kind_(kind), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string fetch(uint32_t tensor, uint64_t from,
                    const std::function<bool(uint64_t, std::span<const uint8_t>)>& chunk) override {
    {
      std::lock_guard lock(mutex_);
      offsets_.push_back(from);
    }
    const gguf::TensorInfo& t = file_.tensors()[tensor];
    std::vector<uint8_t> bytes(file_.tensor_data(t), file_.tensor_data(t) + t.size_bytes);
    if (kind_ == Kind::Corrupt) bytes.at(std::min<size_t>(1500, bytes.size() - 1)) ^= 0x40;
    for (uint64_t offset = from; offset < bytes.size(); offset += 1000) {
      if (kind_ == Kind::Broken && offset > from) return "connection reset";
      const uint64_t length = std::min<uint64_t>(1000, bytes.size() - offset);
      if (!chunk(offset, {bytes.data() + offset, length})) return "stopped";
    }
    return {};
  }
  std::vector<uint64_t> offsets() const {
    std::lock_guard lock(mutex_);
    return offsets_;
  }
  int calls() const { return static_cast<int>(offsets().size()); }

 private:
  const gguf::File& file_;
  Kind kind_;
  std::string name_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> offsets_;
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

// GLM's NextN layer (blk.4 of glm4moe-tiny, after its 4 layers) is no range's: not even the
// whole model's.
TEST(Weights, NoRangeNeedsTheNextNLayer) {
  const fs::path path = fs::temp_directory_path() / ("strata-weights-" + std::to_string(::getpid()) + "-glm.gguf");
  model::write_synthetic_model(*model::find_synthetic_shape("glm4moe-tiny"), model::parse_weight_types("F32"),
                               path.string(), 7);
  const auto file = gguf::File::open(path.string());
  fs::remove(path);
  size_t nextn = 0;
  for (const gguf::TensorInfo& t : file->tensors()) nextn += t.name.starts_with("blk.4.");
  ASSERT_GT(nextn, 0u);
  const std::vector<size_t> all = tensors_for(*file, {0, 4});
  EXPECT_EQ(all.size(), file->tensors().size() - nextn);
  for (size_t i : all) EXPECT_FALSE(file->tensors()[i].name.starts_with("blk.4.")) << file->tensors()[i].name;
}

TEST_F(WeightsTest, APartialFileHasTheWholeHeaderAndHolesAndKeepsWhatWasVerified) {
  const size_t tensor = 3;
  {
    const std::shared_ptr<PartialModel> model = open();
    EXPECT_EQ(model->file()->header_bytes().size(), original_->header_bytes().size());
    EXPECT_EQ(model->file()->file_size(), original_->file_size());
    EXPECT_EQ(model_hash(*model->file()), manifest_.model_hash);
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
    for (unsigned char c : manifest_.tensor_sha256[static_cast<size_t>(i)]) out += std::string{kDigits[c >> 4], kDigits[c & 15]};
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

TEST_F(WeightsTest, ATensorCutShortResumesFromItsLastCheckpoint) {
  const size_t tensor = 0;  // token_embd, 128 KiB
  const uint64_t size = original_bytes(tensor).size();
  {
    const std::shared_ptr<PartialModel> model = open(4096);
    write_part(*model, tensor, 10'500);  // records at 5000 and 10000, then killed
    EXPECT_EQ(model->held_bytes(tensor), 10'000u);
  }
  const std::shared_ptr<PartialModel> model = open(4096);
  EXPECT_FALSE(model->holds(tensor));
  EXPECT_EQ(model->held_bytes(tensor), 10'000u) << "only what the last checkpoint synced is claimed";
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  const std::vector<size_t> one{tensor};
  fetch_tensors(*model, one, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; },
                FetchOptions{}, stats);
  EXPECT_EQ(good->offsets(), std::vector<uint64_t>{10'000}) << "the source is asked for the rest only";
  EXPECT_EQ(stats.snapshot().received_bytes, size - 10'000);
  EXPECT_TRUE(model->holds(tensor)) << "the hash of the bytes read back and the rest verifies";
  EXPECT_EQ(model->held_bytes(tensor), size);
  EXPECT_TRUE(open()->holds(tensor));
}

TEST_F(WeightsTest, AFetchStoppedOnPurposeRecordsHowFarItsTensorGot) {
  const size_t tensor = 0;  // token_embd, 128 KiB: no periodic record within it
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  const std::vector<size_t> one{tensor};
  {
    const std::shared_ptr<PartialModel> model = open();
    TransferStats stats;
    FetchOptions options;
    options.rounds = 1;  // the stop comes in the tensor's last attempt
    options.stop = [&] { return stats.snapshot().received_bytes >= 7'000; };
    EXPECT_THROW(fetch_tensors(*model, one, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; },
                               options, stats),
                 std::runtime_error);
    EXPECT_EQ(stats.snapshot().received_bytes, 7'000u);
  }
  const std::shared_ptr<PartialModel> model = open();
  EXPECT_FALSE(model->holds(tensor));
  EXPECT_EQ(model->held_bytes(tensor), 7'000u) << "a restart resumes where the stop left the tensor";
  TransferStats stats;
  fetch_tensors(*model, one, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; }, FetchOptions{},
                stats);
  EXPECT_EQ(good->offsets(), (std::vector<uint64_t>{0, 7'000}));
  EXPECT_TRUE(model->holds(tensor));
}

TEST_F(WeightsTest, ATransferThatBreaksGoesOnFromTheNextSourceWhereItStopped) {
  const std::shared_ptr<PartialModel> model = open();
  auto broken = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Broken, "broken");
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  const std::vector<size_t> one{0};
  fetch_tensors(*model, one, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{broken, good}; },
                FetchOptions{}, stats);
  EXPECT_TRUE(model->holds(0));
  EXPECT_EQ(broken->offsets(), std::vector<uint64_t>{0});
  EXPECT_EQ(good->offsets(), std::vector<uint64_t>{1000});
  EXPECT_EQ(stats.snapshot().received_bytes, original_bytes(0).size()) << "no byte came twice";
}

TEST_F(WeightsTest, OnlyWholeProgressLinesWithinTheirTensorCount) {
  std::vector<uint64_t> sizes;
  for (const gguf::TensorInfo& t : original_->tensors()) sizes.push_back(t.size_bytes);
  std::string text;
  text += "0 5000\n";                                    // counts
  text += "1 " + std::to_string(sizes[1] + 1) + "\n";    // past the tensor's end
  text += "2 7000\n2 " + std::to_string(sizes[2]) + "1\n";  // the later line is past the end
  text += "99999 10\n";                                  // no such tensor
  text += "3 12x\n3 -4\n3 \n 3 100\ngarbage\n\n";         // not numbers
  text += "4 3000\n4 0\n";                               // started over: the last line counts
  text += "5 " + std::to_string(sizes[5]) + "\n";         // all of it, not yet verified
  text += "6 3000";                                       // cut short by a crash
  const std::vector<uint64_t> progress = parse_progress(text, sizes);
  ASSERT_EQ(progress.size(), sizes.size());
  for (size_t i = 0; i < progress.size(); ++i) {
    const uint64_t expected = i == 0 ? 5000 : i == 2 ? 7000 : i == 5 ? sizes[5] : 0;
    EXPECT_EQ(progress[i], expected) << i;
  }
}

TEST_F(WeightsTest, AProgressRecordClaimsNothingPastATensorNorForAVerifiedOne) {
  {
    const std::shared_ptr<PartialModel> model = open();
    PartialModel::Writer writer = model->writer(1);
    writer.write(0, original_bytes(1));
    writer.commit();
  }
  std::ofstream(progress_record(), std::ios::app)
      << "1 100\n2 " << original_bytes(2).size() + 1 << "\n3 1x00\n4 200\n5 30";
  const std::shared_ptr<PartialModel> model = open();
  EXPECT_EQ(model->held_bytes(1), original_bytes(1).size());
  EXPECT_EQ(model->held_bytes(2), 0u);
  EXPECT_EQ(model->held_bytes(3), 0u);
  EXPECT_EQ(model->held_bytes(4), 200u);
  EXPECT_EQ(model->held_bytes(5), 0u);
  EXPECT_EQ(model->writer(4).written(), 200u);
}

TEST_F(WeightsTest, BadBytesOnDiskBeforeTheCheckpointAreFetchedAgainFromTheStart) {
  const size_t tensor = 0;
  const uint64_t size = original_bytes(tensor).size();
  std::string path;
  {
    const std::shared_ptr<PartialModel> model = open(4096);
    write_part(*model, tensor, 10'500);
    path = model->file()->path();
  }
  const auto damage = [&](uint64_t at) {
    std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
    const gguf::TensorInfo& t = original_->tensors()[tensor];
    file.seekp(static_cast<std::streamoff>(original_->header_bytes().size() + t.offset + at));
    file.put(static_cast<char>(original_bytes(tensor)[at] ^ 0x10));
  };
  damage(3000);
  {
    // Resumed, the bytes read back do not hash right: the tensor starts over, and a restart does
    // not resume past the bad bytes either.
    const std::shared_ptr<PartialModel> model = open(4096);
    PartialModel::Writer writer = model->writer(tensor);
    ASSERT_EQ(writer.written(), 10'000u);
    writer.write(10'000, original_bytes(tensor).subspan(10'000));
    EXPECT_THROW(writer.commit(), std::runtime_error);
    EXPECT_EQ(writer.written(), 0u);
    EXPECT_EQ(model->held_bytes(tensor), 0u);
  }
  EXPECT_EQ(open(4096)->held_bytes(tensor), 0u);

  // Damaged again after the next run's checkpoints, a fetch goes on from the checkpoint, then
  // fetches the tensor again from byte 0 and verifies it.
  write_part(*open(4096), tensor, 10'500);
  damage(3000);
  const std::shared_ptr<PartialModel> model = open(4096);
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  const std::vector<size_t> one{tensor};
  fetch_tensors(*model, one, [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; },
                FetchOptions{}, stats);
  EXPECT_EQ(good->offsets(), (std::vector<uint64_t>{10'000, 0}));
  EXPECT_EQ(stats.snapshot().received_bytes, size - 10'000 + size);
  EXPECT_TRUE(model->holds(tensor));
  const gguf::TensorInfo& t = model->file()->tensors()[tensor];
  EXPECT_EQ(std::memcmp(model->file()->tensor_data(t), original_bytes(tensor).data(), size), 0);
}

TEST_F(WeightsTest, AManifestWhoseHeaderIsNotTheModelsIsRefused) {
  cluster_types::ModelManifest forged = manifest_;
  forged.header.at(40) ^= 1;
  EXPECT_THROW(PartialModel::open(dir_.string(), forged), std::runtime_error);
  cluster_types::ModelManifest short_hashes = manifest_;
  short_hashes.tensor_sha256.pop_back();
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
  EXPECT_GT(corrupt->calls(), 0);
  EXPECT_GT(broken->calls(), 0);
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
  EXPECT_EQ(first->calls() + second->calls(), static_cast<int>(all.size()));
  EXPECT_EQ(first->calls(), static_cast<int>((all.size() + 1) / 2));
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
  EXPECT_TRUE(model->held().whole_file);
}

TEST_F(WeightsTest, HeldWeightsCountWholeLayersAndTheHead) {
  const std::shared_ptr<PartialModel> model = open();
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  fetch_tensors(*model, tensors_for(*original_, {3, 4}), [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; },
                FetchOptions{}, stats);
  const cluster_types::Weights held = model->held();
  const ModelFootprint footprint = footprint_of(*original_);
  EXPECT_FALSE(held.whole_file);
  ASSERT_EQ(held.layer_bytes.size(), 4u);
  EXPECT_EQ(held.layer_bytes[0], 0u);
  EXPECT_EQ(held.layer_bytes[3], footprint.layer_weight_bytes[3]);
  EXPECT_TRUE(held.head);
  EXPECT_FALSE(held.embedding);
}

// A Llama 3-style model: the shared model with rope_freqs, a tensor of no layer that every
// stage reads, so that a node that fetched its layers' tensors can be a source of it too.
TEST_F(WeightsTest, TensorsEveryStageReadsAreFetchedForEveryRangeAndReportedHeld) {
  const int pairs = model::Config::from_gguf(*original_).rope_dim / 2;
  std::vector<float> factors;
  for (int i = 0; i < pairs; ++i) factors.push_back(1.0f + static_cast<float>(i));
  fs::create_directories(dir_);
  const std::string path = (dir_ / "rope_freqs.gguf").string();
  model::testing::write_variant(*original_, path, {}, {{"rope_freqs.weight", factors}});
  original_ = gguf::File::open(path);
  manifest_ = make_manifest(*original_, model_hash(*original_), 2);
  const size_t rope_freqs = original_->tensors().size() - 1;
  ASSERT_EQ(original_->tensors()[rope_freqs].name, "rope_freqs.weight");

  for (const model::LayerRange range : {model::LayerRange{0, 1}, {1, 3}, {3, 4}}) {
    const std::vector<size_t> needed = tensors_for(*original_, range);
    EXPECT_NE(std::find(needed.begin(), needed.end(), rope_freqs), needed.end()) << range.first << "-" << range.last;
  }
  const std::shared_ptr<PartialModel> model = open();
  EXPECT_FALSE(model->held().shared);
  auto good = std::make_shared<FakeSource>(*original_, FakeSource::Kind::Good, "good");
  TransferStats stats;
  fetch_tensors(*model, tensors_for(*original_, {1, 3}),
                [&](size_t) { return std::vector<std::shared_ptr<TensorSource>>{good}; }, FetchOptions{}, stats);
  const cluster_types::Weights held = model->held();
  EXPECT_FALSE(held.whole_file);
  EXPECT_TRUE(held.shared) << "a middle stage holds rope_freqs and can pass it on";
  EXPECT_FALSE(held.embedding);
  EXPECT_FALSE(held.head);
}

}  // namespace
}  // namespace strata::cluster
