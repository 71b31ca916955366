#include "rpc/messages.h"

namespace strata::rpc {
namespace {

constexpr int kMaxSequencesPerBatch = 4096;
constexpr int64_t kMaxRowsPerBatch = 1 << 16;
constexpr int kMaxCapacity = 1 << 20;

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

std::string malformed(const HoldPrefixRequest& request) {
  if (request.sequence_id() == 0) return request.tokens_size() == 0 ? std::string() : "a pool query carries tokens";
  if (request.capacity() <= 0 || request.capacity() > kMaxCapacity) return "a sequence asks for an impossible capacity";
  if (request.tokens_size() >= request.capacity()) return "the prefix runs past the sequence's capacity";
  return {};
}

}  // namespace strata::rpc
