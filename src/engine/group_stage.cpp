#include "engine/group_stage.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace strata::engine {
namespace {

// The rows a LayerKv holds: positions [first_position, positions).
size_t held_rows(const LayerKv& kv) {
  if (kv.first_position < 0 || kv.positions < kv.first_position) {
    throw std::invalid_argument("layer " + std::to_string(kv.layer) + " of sequence " + std::to_string(kv.id) +
                                " holds positions " + std::to_string(kv.first_position) + " to " + std::to_string(kv.positions));
  }
  return static_cast<size_t>(kv.positions - kv.first_position);
}

// The bytes of one of `rows` rows of `kv`.
size_t row_bytes(const model::KvRows& kv, size_t rows) {
  if (rows == 0 ? !kv.bytes.empty() : kv.bytes.size() % rows != 0) {
    throw std::invalid_argument(std::to_string(kv.bytes.size()) + " bytes are not " + std::to_string(rows) + " rows");
  }
  return rows == 0 ? 0 : kv.bytes.size() / rows;
}

// The members' `field`s, each row the members' parts of it in member order.
model::KvRows joined(const std::vector<LayerKv>& parts, model::KvRows LayerKv::*field, size_t rows) {
  std::vector<size_t> widths;
  for (const LayerKv& part : parts) widths.push_back(row_bytes(part.*field, rows));
  model::KvRows whole{(parts.front().*field).type, {}};
  whole.bytes.reserve(rows * std::accumulate(widths.begin(), widths.end(), size_t{0}));
  for (size_t row = 0; row < rows; ++row) {
    for (size_t m = 0; m < parts.size(); ++m) {
      const uint8_t* part_row = (parts[m].*field).bytes.data() + row * widths[m];
      whole.bytes.insert(whole.bytes.end(), part_row, part_row + widths[m]);
    }
  }
  return whole;
}

// `whole` split among members that hold `kv_heads` heads each, in order: per row, each
// member's heads' part.
std::vector<model::KvRows> split(const model::KvRows& whole, size_t rows, std::span<const int> kv_heads) {
  const size_t width = row_bytes(whole, rows);
  const int heads = std::accumulate(kv_heads.begin(), kv_heads.end(), 0);
  if (width % static_cast<size_t>(heads) != 0) {
    throw std::invalid_argument("rows of " + std::to_string(width) + " bytes do not split into " + std::to_string(heads) +
                                " KV heads");
  }
  const size_t head_bytes = width / static_cast<size_t>(heads);
  std::vector<model::KvRows> parts;
  size_t offset = 0;  // of the member's part in a row
  for (int member_heads : kv_heads) {
    const size_t part_width = head_bytes * static_cast<size_t>(member_heads);
    model::KvRows& part = parts.emplace_back(model::KvRows{whole.type, std::vector<uint8_t>(rows * part_width)});
    for (size_t row = 0; row < rows; ++row) {
      if (part_width > 0) std::memcpy(part.bytes.data() + row * part_width, whole.bytes.data() + row * width + offset, part_width);
    }
    offset += part_width;
  }
  return parts;
}

}  // namespace

GroupStage::GroupStage(std::vector<std::shared_ptr<Stage>> members, std::span<const model::TensorShare> shares)
    : members_(std::move(members)) {
  if (members_.empty()) throw std::invalid_argument("a tensor-parallel group needs at least one member");
  for (const auto& member : members_) {
    if (member == nullptr) throw std::invalid_argument("a tensor-parallel group's member is missing");
  }
  for (size_t m = 0; m < members_.size(); ++m) {
    (m > 0 && !members_[m]->chain_node().empty() ? elsewhere_ : here_).push_back(m);
  }
  layers_ = members_.front()->layers();
  for (const auto& member : members_) {
    const StageLayers said = member->layers();
    if (said.first >= said.last) {
      layers_ = {};
      break;
    }
    if (said.first != layers_.first || said.last != layers_.last) {
      throw std::invalid_argument("a tensor-parallel group's members compute different layers: [" +
                                  std::to_string(layers_.first) + ", " + std::to_string(layers_.last) + ") and [" +
                                  std::to_string(said.first) + ", " + std::to_string(said.last) + ")");
    }
  }
  if (shares.empty()) return;
  if (shares.size() != members_.size()) {
    throw std::invalid_argument("a tensor-parallel group of " + std::to_string(members_.size()) + " members was given " +
                                std::to_string(shares.size()) + " shares");
  }
  int next_head = 0;
  for (const model::TensorShare& share : shares) {
    if (share.kv_heads.first != next_head || share.kv_heads.size() <= 0) {
      throw std::invalid_argument("a tensor-parallel group's shares do not hold contiguous KV heads in member order");
    }
    next_head = share.kv_heads.last;
    kv_heads_.push_back(share.kv_heads.size());
  }
}

namespace {

bool is_lost(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const StageLost&) {
    return true;
  } catch (...) {
    return false;
  }
}

// A member's StageLost (the first in member order), else the first member's failure.
void rethrow_first(const std::vector<std::exception_ptr>& failures) {
  for (const std::exception_ptr& failure : failures) {
    if (failure != nullptr && is_lost(failure)) std::rethrow_exception(failure);
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure != nullptr) std::rethrow_exception(failure);
  }
}

}  // namespace

void GroupStage::failing_alone(size_t member, const std::function<void()>& call,
                               std::vector<std::exception_ptr>& failures) {
  try {
    call();
  } catch (const StageLost&) {
    failures[member] = std::current_exception();
    leave_group();
  } catch (...) {
    failures[member] = std::current_exception();
  }
}

void GroupStage::at_once(std::span<const size_t> members, const std::function<void(size_t member)>& call,
                         std::vector<std::exception_ptr>& failures) {
  if (members.empty()) return;
  const auto run = [&](size_t m) { failing_alone(m, [&] { call(m); }, failures); };
  std::vector<std::thread> others;
  others.reserve(members.size() - 1);
  for (const size_t m : members.subspan(1)) others.emplace_back(run, m);
  run(members.front());
  for (std::thread& other : others) other.join();
}

void GroupStage::on_every_member(const std::function<void(size_t member)>& call) {
  std::vector<size_t> all(members_.size());
  std::iota(all.begin(), all.end(), size_t{0});
  std::vector<std::exception_ptr> failures(members_.size());
  at_once(all, call, failures);
  rethrow_first(failures);
}

std::vector<std::exception_ptr> GroupStage::take_answers() {
  if (answering_.joinable()) answering_.join();
  return std::exchange(answer_failures_, {});
}

std::unique_lock<std::mutex> GroupStage::settled() {
  std::unique_lock lock(mutex_);
  rethrow_first(take_answers());
  return lock;
}

GroupStage::~GroupStage() {
  if (answering_.joinable()) answering_.join();
}

std::string GroupStage::chain_node() const {
  for (const auto& member : members_) {
    if (member->chain_node().empty()) return {};
  }
  return members_.front()->chain_node();
}

void GroupStage::send(const StageBatch& batch) {
  StageBatch alone = batch;
  alone.then.clear();
  std::vector<std::exception_ptr> failures(members_.size());
  const auto lock = settled();
  // A send does not wait: one after another, in member order as every call.
  for (size_t m = 0; m < members_.size(); ++m) {
    failing_alone(m, [&] { members_[m]->send(m == 0 ? batch : alone); }, failures);
  }
  std::lock_guard sent_lock(sent_mutex_);
  sent_.push_back(std::move(failures));
}

StageOutput GroupStage::receive() {
  std::vector<std::exception_ptr> failures;
  {
    std::lock_guard lock(sent_mutex_);
    if (sent_.empty()) throw std::logic_error("a batch is received before it was sent");
    failures = std::move(sent_.front());
    sent_.pop_front();
  }
  StageOutput first;
  for (size_t m = 0; m < members_.size(); ++m) {
    if (failures[m] != nullptr) continue;  // the batch never reached it
    failing_alone(m, [&] {
      StageOutput out = members_[m]->receive();
      if (m == 0) first = std::move(out);
    }, failures);
  }
  rethrow_first(failures);
  return first;
}

StageOutput GroupStage::forward(const StageBatch& batch) {
  std::lock_guard lock(mutex_);
  std::vector<std::exception_ptr> failures(members_.size());
  std::vector<size_t> elsewhere = elsewhere_;
  for (const size_t m : elsewhere) failing_alone(m, [&] { members_[m]->send(batch); }, failures);
  StageOutput first;
  at_once(here_, [&](size_t m) {
    StageOutput out = members_[m]->forward(batch);
    if (m == 0) first = std::move(out);
  }, failures);
  std::erase_if(elsewhere, [&](size_t m) { return failures[m] != nullptr; });  // never sent the batch
  const auto receive_answers = [this, elsewhere](std::vector<std::exception_ptr>& into) {
    for (const size_t m : elsewhere) failing_alone(m, [&] { members_[m]->receive(); }, into);
  };
  const std::vector<std::exception_ptr> earlier = take_answers();
  if (std::any_of(failures.begin(), failures.end(), [](const std::exception_ptr& f) { return f != nullptr; })) {
    // The others' answers say whether one of them was lost, which is then the group's failure.
    receive_answers(failures);
    rethrow_first(failures);
  }
  if (!elsewhere.empty()) {
    answer_failures_.assign(members_.size(), nullptr);
    answering_ = std::thread([this, receive_answers] { receive_answers(answer_failures_); });
  }
  rethrow_first(earlier);
  return first;
}

void GroupStage::release(std::span<const SequenceId> ids) {
  std::lock_guard lock(mutex_);
  // A failure among the last forward's answers must not keep the sequences' state.
  const std::vector<std::exception_ptr> earlier = take_answers();
  on_every_member([&](size_t m) { members_[m]->release(ids); });
  rethrow_first(earlier);
}

void GroupStage::cancel() {
  for (const auto& member : members_) member->cancel();
}

void GroupStage::leave_group() {
  for (const auto& member : members_) member->leave_group();
}

LayerKv GroupStage::read_kv(SequenceId id, int layer) {
  std::vector<LayerKv> parts(members_.size());
  {
    const auto lock = settled();
    on_every_member([&](size_t m) { parts[m] = members_[m]->read_kv(id, layer); });
  }
  LayerKv& first = parts.front();
  for (const LayerKv& part : parts) {
    if (part.positions != first.positions || part.capacity != first.capacity ||
        part.first_position != first.first_position || part.tokens != first.tokens || part.keys.type != first.keys.type ||
        part.values.type != first.values.type) {
      throw std::runtime_error("the members of a tensor-parallel group hold different states of sequence " +
                               std::to_string(id) + " for layer " + std::to_string(layer));
    }
  }
  const size_t rows = held_rows(first);
  model::KvRows keys = joined(parts, &LayerKv::keys, rows);
  model::KvRows values = joined(parts, &LayerKv::values, rows);
  return {id, layer, first.positions, first.capacity, first.first_position, std::move(keys), std::move(values),
          std::move(first.tokens)};
}

void GroupStage::write_kv(const LayerKv& kv) {
  if (kv_heads_.empty()) throw StageLost("this tensor-parallel group was not given its members' shares: it cannot take over state");
  const size_t rows = held_rows(kv);
  std::vector<model::KvRows> keys = split(kv.keys, rows, kv_heads_);
  std::vector<model::KvRows> values = split(kv.values, rows, kv_heads_);
  const auto lock = settled();
  on_every_member([&](size_t m) {
    members_[m]->write_kv({kv.id, kv.layer, kv.positions, kv.capacity, kv.first_position, std::move(keys[m]),
                           std::move(values[m]), kv.tokens});
  });
}

int GroupStage::hold_prefix(SequenceId id, int capacity, std::span<const Token> tokens) {
  const auto lock = settled();
  std::vector<int> held(members_.size());
  std::span<const Token> asked = tokens;
  while (true) {
    on_every_member([&](size_t m) { held[m] = members_[m]->hold_prefix(id, capacity, asked); });
    const auto [least, most] = std::minmax_element(held.begin(), held.end());
    if (*least == *most) return *least;
    asked = tokens.first(static_cast<size_t>(*least));
  }
}

model::KvBlockCounts GroupStage::kv_blocks() {
  std::vector<model::KvBlockCounts> counts(members_.size());
  on_every_member([&](size_t m) { counts[m] = members_[m]->kv_blocks(); });
  model::KvBlockCounts fewest = counts.front();
  for (const model::KvBlockCounts& c : counts) {
    fewest.full = std::min(fewest.full, c.full);
    fewest.window = std::min(fewest.window, c.window);
  }
  return fewest;
}

}  // namespace strata::engine
