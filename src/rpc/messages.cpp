#include "rpc/messages.h"

#include <stdexcept>

namespace strata::rpc {
namespace {

constexpr int kMaxSequencesPerBatch = 4096;
constexpr int64_t kMaxRowsPerBatch = 1 << 16;
constexpr int kMaxCapacity = 1 << 20;

// The element type a LayerKv message's rows are in.
model::KvType wire_type(const LayerKv& kv) { return kv.half() ? model::KvType::F16 : model::KvType::F32; }

}  // namespace

std::string malformed(const ForwardRequest& request) {
  if (request.sequences_size() == 0) return "the batch has no sequences";
  if (request.sequences_size() > kMaxSequencesPerBatch) return "the batch has too many sequences";
  int64_t rows = 0;
  for (const SequenceWork& w : request.sequences()) {
    if (w.token_count() <= 0) return "a sequence has no inputs";
    if (w.first_position() < 0) return "a sequence starts at a negative position";
    if (w.capacity() <= 0 || w.capacity() > kMaxCapacity) return "a sequence asks for an impossible capacity";
    if (int64_t{w.first_position()} + w.token_count() > w.capacity()) return "a sequence runs past its capacity";
    rows += w.token_count();
  }
  if (rows > kMaxRowsPerBatch) return "the batch has too many rows";
  if (request.tokens_size() != rows) return "the token count does not match the sequences";
  if (request.hidden().size() % (static_cast<size_t>(rows) * sizeof(float)) != 0) {
    return "the hidden rows do not match the sequences";
  }
  return {};
}

std::string malformed(const LayerKv& kv) {
  if (kv.layer() < 0) return "the state is of a negative layer";
  if (kv.positions() < 0 || kv.capacity() < kv.positions() || kv.capacity() > kMaxCapacity) {
    return "the state has impossible positions or capacity";
  }
  if (kv.keys().size() != kv.values().size()) return "the state's keys and values differ in size";
  const size_t element = model::kv_element_bytes(wire_type(kv));
  const size_t row_floats = kv.positions() == 0 ? 0 : kv.keys().size() / element / static_cast<size_t>(kv.positions());
  if (kv.positions() == 0 ? !kv.keys().empty()
                          : row_floats == 0 || kv.keys().size() != row_floats * element * static_cast<size_t>(kv.positions())) {
    return "the state's keys are not whole rows of its positions";
  }
  if (kv.tokens_size() != 0 && kv.tokens_size() != kv.positions()) return "the state's token ids do not match its positions";
  return {};
}

void to_message(const engine::LayerKv& kv, LayerKv& out) {
  out.set_sequence_id(kv.id);
  out.set_layer(kv.layer);
  out.set_positions(kv.positions);
  out.set_capacity(kv.capacity);
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
          {wire_type(message), std::vector<uint8_t>(message.keys().begin(), message.keys().end())},
          {wire_type(message), std::vector<uint8_t>(message.values().begin(), message.values().end())},
          std::vector<engine::Token>(message.tokens().begin(), message.tokens().end())};
}

void to_message(const engine::HeldState& held, HeldState& out) {
  out.set_epoch(held.pipeline);
  out.set_sequence_id(held.sequence);
  out.set_positions(held.positions);
}

engine::HeldState from_message(const HeldState& message) {
  return {message.epoch(), message.sequence_id(), message.positions()};
}

std::string malformed(const ModelManifestReply& manifest) {
  if (manifest.header().size() < 24) return "the manifest's header is shorter than a GGUF header";
  if (manifest.file_size() < manifest.header().size()) return "the manifest's file is smaller than its header";
  if (manifest.model_hash().size() != 64 ||
      manifest.model_hash().find_first_not_of("0123456789abcdef") != std::string::npos) {
    return "the manifest's model hash is not 64 lowercase hex digits";
  }
  for (const std::string& hash : manifest.tensor_sha256()) {
    if (hash.size() != 32) return "a tensor hash of the manifest is not 32 bytes";
  }
  return {};
}

std::string malformed(const HoldPrefixRequest& request) {
  if (request.sequence_id() == 0) return request.tokens_size() == 0 ? std::string() : "a pool query carries tokens";
  if (request.capacity() <= 0 || request.capacity() > kMaxCapacity) return "a sequence asks for an impossible capacity";
  if (request.tokens_size() >= request.capacity()) return "the prefix runs past the sequence's capacity";
  return {};
}

}  // namespace strata::rpc
