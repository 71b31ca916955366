#include "rpc/messages.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <set>
#include <span>
#include <stdexcept>
#include <string_view>

#include "sampling/params.h"

namespace strata::rpc {
namespace {

constexpr int kMaxSequencesPerBatch = 4096;
constexpr int kMaxDrafts = 256;  // per sequence and step
constexpr int64_t kMaxRowsPerBatch = 1 << 16;
constexpr int kMaxCapacity = 1 << 20;
constexpr int kMaxVocabulary = 1 << 24;
constexpr int kMaxLayers = 1 << 16;
constexpr int kMaxNodes = 1024;  // in a Hello's lists and a placement
constexpr size_t kMaxNameBytes = 1024;      // ids, addresses, names
constexpr size_t kMaxTextBytes = 64 << 10;  // a placement's reason or error, a line per node
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr sampling::Range kFractionRange{0, 1};

// The first field that breaks its rule; the checks below throw it, malformed() returns it.
struct Malformed {
  std::string why;
};

[[noreturn]] void refuse(std::string_view field, const std::string& why) {
  throw Malformed{"field '" + std::string(field) + "' " + why};
}

template <typename Checks>
std::string first_problem(const Checks& checks) {
  try {
    checks();
  } catch (const Malformed& problem) {
    return problem.why;
  }
  return {};
}

std::string at(std::string_view list, int index) { return std::string(list) + "[" + std::to_string(index) + "]"; }

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// One rule per kind of field.

enum class Presence { Optional, Required };

void check_integer(std::string_view field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    refuse(field, "is " + std::to_string(value) + ", not between " + std::to_string(min) + " and " +
                      std::to_string(max));
  }
}

void check_integer(std::string_view field, int64_t value, sampling::Range range) {
  check_integer(field, value, static_cast<int64_t>(range.min), static_cast<int64_t>(range.max));
}

void check_number(std::string_view field, double value, sampling::Range range) {
  if (!range.contains(value)) {
    refuse(field, "is " + number_text(value) + ", not between " + number_text(range.min) + " and " +
                      number_text(range.max));
  }
}

// A field of a float type, against its range's bounds as floats: the API's bounds, after the
// same rounding (0.01 becomes 0.0099999998 on the way).
void check_number(std::string_view field, float value, sampling::Range range) {
  check_number(field, static_cast<double>(value),
               {static_cast<float>(range.min), static_cast<float>(range.max)});
}

// A rate or a duration a node measured.
void check_measure(std::string_view field, double value) {
  if (!(value >= 0 && std::isfinite(value))) refuse(field, "is " + number_text(value) + ", not a finite number >= 0");
}

void check_name(std::string_view field, const std::string& value, Presence presence = Presence::Optional) {
  if (presence == Presence::Required && value.empty()) refuse(field, "is empty");
  if (value.size() > kMaxNameBytes) refuse(field, "is longer than " + std::to_string(kMaxNameBytes) + " bytes");
}

void check_text(std::string_view field, const std::string& value) {
  if (value.size() > kMaxTextBytes) refuse(field, "is longer than " + std::to_string(kMaxTextBytes) + " bytes");
}

void check_choice(std::string_view field, const std::string& value, std::span<const std::string_view> choices) {
  std::string listed;
  for (const std::string_view choice : choices) {
    if (value == choice) return;
    listed += (listed.empty() ? "'" : ", '") + std::string(choice) + "'";
  }
  check_name(field, value);
  refuse(field, "is '" + value + "', not one of " + listed);
}

void check_choice(std::string_view field, const std::string& value, std::initializer_list<std::string_view> choices) {
  check_choice(field, value, std::span<const std::string_view>(choices.begin(), choices.size()));
}

// HOST:PORT, the host empty for a node that listens on every interface (it is reached at the
// address its calls come from). `min_port` 0 lets an API say it asked for any free port.
void check_address(std::string_view field, const std::string& value, int min_port) {
  check_name(field, value, Presence::Required);
  const size_t colon = value.rfind(':');
  const std::string port = colon == std::string::npos ? std::string() : value.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < min_port || std::stoi(port) > 65535) {
    refuse(field, "is '" + value + "', not HOST:PORT with a port from " + std::to_string(min_port) + " to 65535");
  }
}

// A SHA-256 as lowercase hex.
void check_hash(std::string_view field, const std::string& value, Presence presence) {
  if (value.empty() && presence == Presence::Optional) return;
  if (value.size() != 64 || value.find_first_not_of("0123456789abcdef") != std::string::npos) {
    refuse(field, "is not 64 lowercase hex digits (a SHA-256)");
  }
}

void check_entries(std::string_view field, int count, int64_t max) {
  if (count > max) refuse(field, "has " + std::to_string(count) + " entries, more than " + std::to_string(max));
}

// Which ids are in the vocabulary is the model's to say; none is negative.
void check_tokens(std::string_view field, const google::protobuf::RepeatedField<int32_t>& tokens, int64_t max) {
  check_entries(field, tokens.size(), max);
  for (int i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) refuse(at(field, i), "is " + std::to_string(tokens[i]) + ", not a token id");
  }
}

void check_layer(std::string_view field, int32_t layer) { check_integer(field, layer, 0, kMaxLayers - 1); }

void check_sender(const std::string& sender_id) { check_name("sender_id", sender_id, Presence::Required); }

// `path` is where the parameters sit in their message ("sampling.", "sequences[2].sampling.params.").
void check_sampling(const SamplingParams& s, const std::string& path = "sampling.") {
  check_number(path + "temperature", s.temperature(), sampling::kTemperatureRange);
  check_integer(path + "top_k", s.top_k(), sampling::kTopKRange);
  check_number(path + "top_p", s.top_p(), sampling::kProbabilityRange);
  check_number(path + "min_p", s.min_p(), sampling::kProbabilityRange);
  check_number(path + "repetition_penalty", s.repetition_penalty(), sampling::kRepetitionPenaltyRange);
  check_number(path + "presence_penalty", s.presence_penalty(), sampling::kPresencePenaltyRange);
  check_number(path + "frequency_penalty", s.frequency_penalty(), sampling::kPresencePenaltyRange);
  check_integer(path + "penalty_last_n", s.penalty_last_n(), sampling::kPenaltyLastNRange);
}

void check_sampling_step(const SamplingStep& step, const std::string& path) {
  check_sampling(step.params(), path + "params.");
  if (step.random_size() != static_cast<int>(std::tuple_size_v<sampling::Random::State>)) {
    refuse(path + "random", "has " + std::to_string(step.random_size()) + " words, not " +
                                std::to_string(std::tuple_size_v<sampling::Random::State>));
  }
  check_tokens(path + "recent", step.recent(), kMaxCapacity);
  check_integer(path + "drafts", step.drafts(), 0, kMaxDrafts);
  // A grammar's mask per row: the first, and each draft's.
  const int rows = step.drafts() + 1;
  check_integer(path + "allowed_count", step.allowed_count(), 0, int64_t{kMaxVocabulary} * rows);
  if (step.allowed_count() % rows != 0) {
    refuse(path + "allowed_count", "is " + std::to_string(step.allowed_count()) + " flags, not a mask for each of " +
                                       std::to_string(rows) + " rows");
  }
  const size_t bytes = (static_cast<size_t>(step.allowed_count()) + 7) / 8;
  if (step.allowed().size() != bytes) {
    refuse(path + "allowed", "has " + std::to_string(step.allowed().size()) + " bytes, not the " + std::to_string(bytes) +
                                 " of " + std::to_string(step.allowed_count()) + " flags");
  }
  check_integer(path + "top_logprobs", step.top_logprobs(), -1, engine::kMaxTopLogprobs);
}

void check_token_choice(std::string_view field, int32_t token, const google::protobuf::RepeatedPtrField<TokenLogprob>& top) {
  check_integer(std::string(field) + ".token", token, 0, kMaxVocabulary - 1);
  check_entries(std::string(field) + ".top", top.size(), engine::kMaxTopLogprobs);
  for (int k = 0; k < top.size(); ++k) {
    check_integer(at(std::string(field) + ".top", k) + ".token", top[k].token(), 0, kMaxVocabulary - 1);
  }
}

// `path` is where the node sits in its message ("sender.", "known[2].").
void check_node(const NodeInfo& node, const std::string& path) {
  const auto field = [&path](std::string_view name) { return path + std::string(name); };
  check_name(field("node_id"), node.node_id(), Presence::Required);
  if (node.protocol_version() != kProtocolVersion) {
    // Listed and left out, never placed; its fields may follow its own protocol's rules, and
    // only those that name it are shown.
    check_name(field("node_address"), node.node_address());
    check_name(field("api_address"), node.api_address());
    check_name(field("model_hash"), node.model_hash());
    check_name(field("model_name"), node.model_name());
    return;
  }
  check_address(field("node_address"), node.node_address(), 1);
  check_address(field("api_address"), node.api_address(), 0);
  check_hash(field("model_hash"), node.model_hash(), Presence::Required);
  check_name(field("model_name"), node.model_name());
  check_measure(field("weight_bytes_per_second"), node.weight_bytes_per_second());
  check_choice(field("state"), node.state(), kNodeStates);
  check_number(field("load_progress"), node.load_progress(), kFractionRange);
  if (node.has_kv_cache()) {
    const auto check_pool = [&](const KvCacheStats& kv, const std::string& at) {
      check_choice(field(at + "type"), kv.type(), {"f32", "f16"});
      check_integer(field(at + "pool_blocks"), kv.pool_blocks(), 0, kInt32Max);
      check_integer(field(at + "used_blocks"), kv.used_blocks(), 0, kv.pool_blocks());
      check_integer(field(at + "pinned_blocks"), kv.pinned_blocks(), 0, kv.pool_blocks());
    };
    check_pool(node.kv_cache(), "kv_cache.");
    if (node.kv_cache().has_window()) {
      if (node.kv_cache().window().has_window()) refuse(field("kv_cache.window.window"), "is a pool of a pool");
      check_pool(node.kv_cache().window(), "kv_cache.window.");
    }
  }
  check_entries(field("links"), node.links_size(), kMaxNodes);
  for (int i = 0; i < node.links_size(); ++i) {
    const LinkMeasure& link = node.links(i);
    const std::string at_link = at(field("links"), i);
    check_name(at_link + ".peer_id", link.peer_id(), Presence::Required);
    check_measure(at_link + ".latency_seconds", link.latency_seconds());
    check_measure(at_link + ".bytes_per_second", link.bytes_per_second());
    if (link.bytes_per_second() == 0) refuse(at_link + ".bytes_per_second", "is 0: no link measured moves nothing");
  }
  const Weights& weights = node.weights();
  check_entries(field("weights.layer_bytes"), weights.layer_bytes_size(), kMaxLayers);
  check_measure(field("weights.bytes_per_second"), weights.bytes_per_second());
  check_measure(field("weights.eta_seconds"), weights.eta_seconds());
}

void check_placement(const Placement& placement, const std::string& path) {
  const auto field = [&path](std::string_view name) { return path + std::string(name); };
  const bool placed = placement.stages_size() > 0;
  check_name(field("leader_id"), placement.leader_id(), placed ? Presence::Required : Presence::Optional);
  check_choice(field("strategy"), placement.strategy(), {"", "speed", "memory", "fixed"});
  check_text(field("reason"), placement.reason());
  check_text(field("error"), placement.error());
  if (placed && !placement.error().empty()) refuse(field("stages"), "are set beside an error, which leaves none");
  check_entries(field("stages"), placement.stages_size(), kMaxNodes);
  std::set<std::string> staged;
  int64_t first_unplaced = 0;  // stages follow each other from layer 0 on
  for (int i = 0; i < placement.stages_size(); ++i) {
    const Stage& stage = placement.stages(i);
    const std::string at_stage = at(field("stages"), i) + ".";
    check_name(at_stage + "node_id", stage.node_id(), Presence::Required);
    if (!staged.insert(stage.node_id()).second) refuse(at_stage + "node_id", "names a node with a stage before");
    check_address(at_stage + "node_address", stage.node_address(), 1);
    check_integer(at_stage + "first_layer", stage.first_layer(), first_unplaced, first_unplaced);
    check_integer(at_stage + "last_layer", stage.last_layer(), first_unplaced + 1, kMaxLayers);
    first_unplaced = stage.last_layer();
  }
}

// The element type a LayerKv message's rows are in.
model::KvType wire_type(const LayerKv& kv) { return kv.half() ? model::KvType::F16 : model::KvType::F32; }

void check_layer_kv(const LayerKv& kv, const std::string& path) {
  const auto field = [&path](std::string_view name) { return path + std::string(name); };
  check_layer(field("layer"), kv.layer());
  check_integer(field("positions"), kv.positions(), 0, kMaxCapacity);
  check_integer(field("capacity"), kv.capacity(), kv.positions(), kMaxCapacity);
  check_integer(field("first_position"), kv.first_position(), 0, kv.positions());
  if (kv.first_position() % model::kKvBlock != 0) {
    refuse(field("first_position"), "is not a whole number of blocks of " + std::to_string(model::kKvBlock));
  }
  const size_t element = model::kv_element_bytes(wire_type(kv));
  const size_t positions = static_cast<size_t>(kv.positions() - kv.first_position());
  // Rows of the values may be narrower than the keys' (latent attention stores none: its
  // values are its keys' latent), never ragged.
  const auto whole_rows = [&](const std::string& bytes, bool may_be_empty) {
    if (positions == 0 || bytes.empty()) return bytes.empty() && (positions == 0 || may_be_empty);
    return bytes.size() % (element * positions) == 0;
  };
  if (!whole_rows(kv.keys(), false)) {
    refuse(field("keys"), "are not whole rows of " + std::to_string(positions) + " positions");
  }
  if (!whole_rows(kv.values(), true) || kv.values().size() > kv.keys().size()) {
    refuse(field("values"), "are " + std::to_string(kv.values().size()) + " bytes, not whole rows of " +
                                std::to_string(positions) + " positions no wider than the keys' " +
                                std::to_string(kv.keys().size()));
  }
  if (kv.tokens_size() != 0 && kv.tokens_size() != kv.positions()) {
    refuse(field("tokens"), "hold " + std::to_string(kv.tokens_size()) + " ids for " + std::to_string(kv.positions()) +
                                " positions");
  }
  check_tokens(field("tokens"), kv.tokens(), kMaxCapacity);
}

}  // namespace

namespace {

// What both sides of a Hello say: who they are, whom they know, their placement.
void check_greeting(const NodeInfo& node, std::string_view node_field,
                    const google::protobuf::RepeatedPtrField<NodeInfo>& known, const Placement& placement) {
  check_node(node, std::string(node_field) + ".");
  check_entries("known", known.size(), kMaxNodes);
  for (int i = 0; i < known.size(); ++i) check_node(known[i], at("known", i) + ".");
  check_placement(placement, "placement.");
}

}  // namespace

std::string malformed(const HelloRequest& request) {
  return first_problem([&] { check_greeting(request.sender(), "sender", request.known(), request.placement()); });
}

std::string malformed(const HelloReply& reply) {
  return first_problem([&] { check_greeting(reply.node(), "node", reply.known(), reply.placement()); });
}

std::string malformed(const ForwardRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    if (request.sequences_size() == 0) refuse("sequences", "is empty: the batch has no sequences");
    check_entries("sequences", request.sequences_size(), kMaxSequencesPerBatch);
    int64_t rows = 0;
    for (int i = 0; i < request.sequences_size(); ++i) {
      const SequenceWork& work = request.sequences(i);
      const std::string at_work = at("sequences", i) + ".";
      check_integer(at_work + "token_count", work.token_count(), 1, kMaxRowsPerBatch);
      check_integer(at_work + "capacity", work.capacity(), 1, kMaxCapacity);
      check_integer(at_work + "first_position", work.first_position(), 0, work.capacity() - work.token_count());
      check_integer(at_work + "output", work.output(), SequenceOutput_MIN, SequenceOutput_MAX);
      if (work.has_sampling()) {
        if (work.output() != LOGITS) refuse(at_work + "sampling", "is given for a sequence that asks for no logits");
        check_sampling_step(work.sampling(), at_work + "sampling.");
        check_integer(at_work + "sampling.drafts", work.sampling().drafts(), 0, work.token_count() - 1);
      }
      if (work.rewind() && work.first_position() == 0) {
        refuse(at_work + "rewind", "is set for a sequence's first batch, which has nothing to rewind");
      }
      rows += work.token_count();
    }
    if (rows > kMaxRowsPerBatch) {
      refuse("sequences", "have " + std::to_string(rows) + " inputs, more than " + std::to_string(kMaxRowsPerBatch));
    }
    if (request.tokens_size() != rows) {
      refuse("tokens", "hold " + std::to_string(request.tokens_size()) + " ids for " + std::to_string(rows) + " inputs");
    }
    check_tokens("tokens", request.tokens(), kMaxRowsPerBatch);
    if (request.hidden().size() % (static_cast<size_t>(rows) * sizeof(float)) != 0) {
      refuse("hidden", "is not whole rows of floats for " + std::to_string(rows) + " inputs");
    }
    check_entries("then", request.then_size(), kMaxNodes);
    for (int i = 0; i < request.then_size(); ++i) check_name(at("then", i), request.then(i), Presence::Required);
  });
}

std::string malformed(const ForwardReply& reply) {
  return first_problem([&] {
    if (reply.rows().size() % sizeof(float) != 0) refuse("rows", "is not whole floats");
    check_entries("sampled", reply.sampled_size(), kMaxSequencesPerBatch);
    for (int i = 0; i < reply.sampled_size(); ++i) {
      const SampledToken& sampled = reply.sampled(i);
      const std::string at_sampled = at("sampled", i);
      check_token_choice(at_sampled, sampled.token(), sampled.top());
      check_text(at_sampled + ".error", sampled.error());
      check_entries(at_sampled + ".continued", sampled.continued_size(), kMaxDrafts);
      for (int c = 0; c < sampled.continued_size(); ++c) {
        check_token_choice(at(at_sampled + ".continued", c), sampled.continued(c).token(), sampled.continued(c).top());
      }
    }
    if (reply.has_failure()) {
      check_name("failure.node_id", reply.failure().node_id(), Presence::Required);
      check_text("failure.error", reply.failure().error());
    }
  });
}

std::string malformed(const ReleaseRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    check_entries("sequence_ids", request.sequence_ids_size(), kMaxSequencesPerBatch);
  });
}

std::string malformed(const HoldPrefixRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    check_tokens("tokens", request.tokens(), kMaxCapacity);
    if (request.sequence_id() == 0) {  // a query of the pool's size
      if (request.tokens_size() != 0) refuse("tokens", "are set in a query of the pool's size (sequence_id 0)");
      return;
    }
    check_integer("capacity", request.capacity(), 1, kMaxCapacity);
    if (request.tokens_size() >= request.capacity()) {
      refuse("tokens", "hold " + std::to_string(request.tokens_size()) + " ids, a prefix past the sequence's capacity");
    }
  });
}

std::string malformed(const ReadKvRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    check_layer("layer", request.layer());
  });
}

std::string malformed(const WriteKvRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    check_layer_kv(request.kv(), "kv.");
  });
}

std::string malformed(const LayerKv& kv) {
  return first_problem([&] { check_layer_kv(kv, ""); });
}

std::string malformed(const GenerateRequest& request) {
  return first_problem([&] {
    check_sender(request.sender_id());
    if (request.prompt_size() == 0) refuse("prompt", "is empty");
    check_tokens("prompt", request.prompt(), kMaxCapacity);
    check_integer("max_tokens", request.max_tokens(), 1, kInt32Max);
    check_sampling(request.sampling());
    check_integer("top_logprobs", request.top_logprobs(), 0, engine::kMaxTopLogprobs);
    check_integer("resumed_after", request.resumed_after(), 0, request.prompt_size() - 1);
    if (request.has_held()) check_integer("held.positions", request.held().positions(), 0, request.prompt_size());
    check_integer("embedding", request.embedding(), 0, static_cast<int>(model::Pooling::Last));
    check_name("request_id", request.request_id());
  });
}

std::string malformed(const ModelManifestRequest& request) {
  return first_problem([&] { check_hash("model_hash", request.model_hash(), Presence::Optional); });
}

std::string malformed(const FetchTensorRequest& request) {
  return first_problem([&] { check_hash("model_hash", request.model_hash(), Presence::Required); });
}

std::string malformed(const ModelManifestReply& manifest) {
  return first_problem([&] {
    if (manifest.header().size() < 24) refuse("header", "is shorter than a GGUF header");
    if (manifest.file_size() < manifest.header().size()) refuse("file_size", "is smaller than the header");
    check_hash("model_hash", manifest.model_hash(), Presence::Required);
    check_name("model_name", manifest.model_name());
    for (int i = 0; i < manifest.tensor_sha256_size(); ++i) {
      if (manifest.tensor_sha256(i).size() != 32) refuse(at("tensor_sha256", i), "is not 32 bytes (a SHA-256)");
    }
  });
}

void to_message(const engine::LayerKv& kv, LayerKv& out) {
  out.set_sequence_id(kv.id);
  out.set_layer(kv.layer);
  out.set_positions(kv.positions);
  out.set_capacity(kv.capacity);
  out.set_first_position(kv.first_position);
  if (kv.keys.type != kv.values.type) throw std::invalid_argument("a layer's keys and values differ in type");
  out.set_half(kv.keys.type == model::KvType::F16);
  out.set_keys(kv.keys.bytes.data(), kv.keys.bytes.size());
  out.set_values(kv.values.bytes.data(), kv.values.bytes.size());
  out.mutable_tokens()->Assign(kv.tokens.begin(), kv.tokens.end());
}

engine::LayerKv from_message(const LayerKv& message) {
  return {message.sequence_id(),
          message.layer(),
          message.positions(),
          message.capacity(),
          message.first_position(),
          {wire_type(message), std::vector<uint8_t>(message.keys().begin(), message.keys().end())},
          {wire_type(message), std::vector<uint8_t>(message.values().begin(), message.values().end())},
          std::vector<engine::Token>(message.tokens().begin(), message.tokens().end())};
}

void to_message(const sampling::SamplingParams& params, SamplingParams& out) {
  out.set_temperature(params.temperature);
  out.set_top_k(params.top_k);
  out.set_top_p(params.top_p);
  out.set_min_p(params.min_p);
  out.set_repetition_penalty(params.repetition_penalty);
  out.set_presence_penalty(params.presence_penalty);
  out.set_frequency_penalty(params.frequency_penalty);
  out.set_penalty_last_n(params.penalty_last_n);
  out.set_seed(params.seed);
}

sampling::SamplingParams from_message(const SamplingParams& m) {
  return {m.temperature(),        m.top_k(),           m.top_p(),          m.min_p(), m.repetition_penalty(),
          m.presence_penalty(), m.frequency_penalty(), m.penalty_last_n(), m.seed()};
}

static_assert(std::endian::native == std::endian::little, "activations travel as little-endian floats");

namespace {

std::vector<float> floats_of(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace

void to_message(const engine::StageBatch& batch, ForwardRequest& out) {
  for (const engine::SequenceWork& work : batch.sequences) {
    SequenceWork& w = *out.add_sequences();
    w.set_sequence_id(work.id);
    w.set_first_position(work.first_position);
    w.set_token_count(work.token_count);
    w.set_capacity(work.capacity);
    w.set_output(static_cast<SequenceOutput>(work.output));
    w.set_rewind(work.rewind);
    if (!work.sampling) continue;
    const sampling::SamplingStep& step = *work.sampling;
    SamplingStep& m = *w.mutable_sampling();
    to_message(step.params, *m.mutable_params());
    m.mutable_random()->Add(step.random.begin(), step.random.end());
    m.mutable_recent()->Add(step.recent.begin(), step.recent.end());
    std::string bits((step.allowed.size() + 7) / 8, '\0');
    for (size_t t = 0; t < step.allowed.size(); ++t) {
      if (step.allowed[t] != 0) bits[t / 8] = static_cast<char>(bits[t / 8] | (1 << (t % 8)));
    }
    m.set_allowed(std::move(bits));
    m.set_allowed_count(static_cast<int32_t>(step.allowed.size()));
    m.set_top_logprobs(step.top_logprobs);
    m.set_drafts(step.drafts);
  }
  out.mutable_tokens()->Add(batch.tokens.begin(), batch.tokens.end());
  out.set_hidden(batch.hidden.data(), batch.hidden.size() * sizeof(float));
  for (const std::string& node : batch.then) out.add_then(node);
}

engine::StageBatch from_message(const ForwardRequest& message) {
  engine::StageBatch batch;
  for (const SequenceWork& w : message.sequences()) {
    engine::SequenceWork work{w.sequence_id(), w.first_position(), w.token_count(), w.capacity()};
    work.output = static_cast<engine::SequenceWork::Output>(w.output());
    work.rewind = w.rewind();
    if (w.has_sampling()) {
      const SamplingStep& m = w.sampling();
      sampling::SamplingStep step;
      step.params = from_message(m.params());
      std::copy(m.random().begin(), m.random().end(), step.random.begin());
      step.recent.assign(m.recent().begin(), m.recent().end());
      step.allowed.resize(static_cast<size_t>(m.allowed_count()));
      for (size_t t = 0; t < step.allowed.size(); ++t) {
        step.allowed[t] = static_cast<uint8_t>((static_cast<unsigned char>(m.allowed()[t / 8]) >> (t % 8)) & 1);
      }
      step.top_logprobs = m.top_logprobs();
      step.drafts = m.drafts();
      work.sampling = std::move(step);
    }
    batch.sequences.push_back(std::move(work));
  }
  batch.tokens.assign(message.tokens().begin(), message.tokens().end());
  batch.hidden = floats_of(message.hidden());
  batch.then.assign(message.then().begin(), message.then().end());
  return batch;
}

void to_message(const engine::StageOutput& output, ForwardReply& out) {
  out.set_rows(output.rows.data(), output.rows.size() * sizeof(float));
  for (const engine::Sampled& sampled : output.sampled) {
    SampledToken& m = *out.add_sampled();
    m.set_token(sampled.choice.token);
    m.set_logprob(sampled.choice.logprob);
    for (const auto& [token, logprob] : sampled.choice.top) {
      TokenLogprob& alternative = *m.add_top();
      alternative.set_token(token);
      alternative.set_logprob(logprob);
    }
    m.set_error(sampled.error);
    for (const sampling::Choice& choice : sampled.continued) {
      TokenChoice& c = *m.add_continued();
      c.set_token(choice.token);
      c.set_logprob(choice.logprob);
      for (const auto& [token, logprob] : choice.top) {
        TokenLogprob& alternative = *c.add_top();
        alternative.set_token(token);
        alternative.set_logprob(logprob);
      }
    }
  }
}

engine::StageOutput from_message(const ForwardReply& message) {
  engine::StageOutput output;
  output.rows = floats_of(message.rows());
  for (const SampledToken& m : message.sampled()) {
    engine::Sampled& sampled = output.sampled.emplace_back();
    sampled.choice.token = m.token();
    sampled.choice.logprob = m.logprob();
    for (const TokenLogprob& alternative : m.top()) sampled.choice.top.emplace_back(alternative.token(), alternative.logprob());
    sampled.error = m.error();
    for (const TokenChoice& c : m.continued()) {
      sampling::Choice& choice = sampled.continued.emplace_back();
      choice.token = c.token();
      choice.logprob = c.logprob();
      for (const TokenLogprob& alternative : c.top()) choice.top.emplace_back(alternative.token(), alternative.logprob());
    }
  }
  return output;
}

void to_message(const engine::HeldState& held, HeldState& out) {
  out.set_epoch(held.pipeline);
  out.set_sequence_id(held.sequence);
  out.set_positions(held.positions);
}

engine::HeldState from_message(const HeldState& message) {
  return {message.epoch(), message.sequence_id(), message.positions()};
}

void to_message(const engine::TokenEvent& event, GenerateEvent& out) {
  if (const auto* token = std::get_if<engine::GeneratedToken>(&event)) {
    out.set_kind(GenerateEvent::TOKEN);
    out.set_token(token->token);
    out.set_logprob(token->logprob);
    out.set_end_of_generation(token->end_of_generation);
    out.set_cached_tokens(token->cached_tokens);
    out.set_drafts_accepted(token->drafts_accepted);
    out.set_drafts_rejected(token->drafts_rejected);
    for (const engine::TokenLogprob& alternative : token->top) {
      TokenLogprob* m = out.add_top();
      m->set_token(alternative.token);
      m->set_logprob(alternative.logprob);
    }
  } else if (std::holds_alternative<engine::RequestStarted>(event)) {
    out.set_kind(GenerateEvent::STARTED);
  } else if (const auto* embedding = std::get_if<engine::PooledEmbedding>(&event)) {
    out.set_kind(GenerateEvent::EMBEDDING);
    out.mutable_embedding()->Add(embedding->vector.begin(), embedding->vector.end());
  } else if (const auto* finished = std::get_if<engine::RequestFinished>(&event)) {
    out.set_kind(GenerateEvent::FINISHED);
    out.set_finish_reason(static_cast<int32_t>(finished->reason));
    out.set_error(finished->error);
  } else if (const auto* passed = std::get_if<engine::RequestPassedOn>(&event)) {
    out.set_kind(GenerateEvent::FINISHED);
    to_message(passed->held, *out.mutable_passed_on());
  }
}

std::optional<engine::TokenEvent> from_message(const GenerateEvent& message) {
  switch (message.kind()) {
    case GenerateEvent::TOKEN: {
      engine::GeneratedToken token;
      token.token = message.token();
      token.logprob = message.logprob();
      token.end_of_generation = message.end_of_generation();
      token.cached_tokens = message.cached_tokens();
      token.drafts_accepted = message.drafts_accepted();
      token.drafts_rejected = message.drafts_rejected();
      for (const TokenLogprob& alternative : message.top()) token.top.push_back({alternative.token(), alternative.logprob()});
      return token;
    }
    case GenerateEvent::STARTED: return engine::RequestStarted{};
    case GenerateEvent::EMBEDDING:
      return engine::PooledEmbedding{{message.embedding().begin(), message.embedding().end()}};
    case GenerateEvent::FINISHED:
      if (message.has_passed_on()) return engine::RequestPassedOn{from_message(message.passed_on())};
      return engine::RequestFinished{static_cast<engine::FinishReason>(message.finish_reason()), message.error()};
    default: return std::nullopt;
  }
}

}  // namespace strata::rpc
