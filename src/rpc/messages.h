// Checks of what peers send, before any of it is used. Kept apart from the service so that a
// fuzzer can drive them with nothing but the generated message code.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "engine/generator.h"
#include "engine/stage.h"
#include "engine/token_stream.h"
#include "node.pb.h"

namespace strata::rpc {

// 3: FetchTensorRequest.offset, which a node of 2 would ignore, sending a resumed tensor from
// its start; a leader's requests passed on with their state (HeldState), and LayerKv.tokens.
// 4: TLS links (rpc/tls.h), and NodeInfo.instance, by which a node of 3 would not refuse a
// second process under its id.
// 5: GenerateEvent.finish_reason Lost (engine::FinishReason), which a node of 4 would show its
// client as a cancellation instead of resuming the request at the next leader.
// 6: the stage that holds the head chooses the tokens (SequenceWork.sampling, ForwardReply.sampled)
// and sends no logits back, which a node of 5 would send, as it would the logits of every prompt
// chunk (SequenceWork.output NOTHING); a stage passes its rows on to the next ones itself
// (ForwardRequest.then, ForwardReply.failure), which a node of 5 would ignore.
// 7: speculative decoding (SamplingStep.drafts, SequenceWork.rewind, SampledToken.continued),
// which a node of 6 would ignore, choosing one token from the last draft's row; a
// sliding-window layer's state moves as its window (LayerKv.first_position), which a node of
// 6 would read from position 0; a stage's pool of sliding-window layers
// (HoldPrefixReply.window_pool_blocks, KvCacheStats.window, NodeInfo.kv_bytes_per_window_layer).
// 8: tensor-parallel groups (Stage.group, NodeInfo.exchange_address), which a node of 7 would
// run as the group's first member alone.
inline constexpr uint32_t kProtocolVersion = 8;

// What a node can say it is doing (NodeInfo.state): placed nowhere yet, placed elsewhere,
// fetching or loading its layers, holding them, leading the placement it serves, or taking no
// part (its node id is another process's).
inline constexpr std::array<std::string_view, 7> kNodeStates{"starting", "idle",    "fetching", "loading",
                                                             "ready",    "serving", "refused"};

// Why a message cannot be acted on, naming the first field that breaks its rule ("field
// 'sampling.temperature' is nan, not between 0 and 2"), or empty when it is well-formed. Every
// request of the node protocol has one, which its handler asks first; each kind of field (an id,
// an address, a hash, a token, a count, a number with a range) has one rule, and the sampling
// fields the ranges the API refuses others by (sampling/params.h). What needs the node's own
// state (an epoch, a sequence, a tensor index) is the handler's to check.
std::string malformed(const HelloRequest& request);
std::string malformed(const HelloReply& reply);
// Also: counts that do not add up, impossible positions or capacities, too many rows, sampling
// steps that are not whole (a generator of 4 words, flags of the bytes they need), drafts that
// are not among the sequence's inputs or come with a grammar's mask, a rewind of a first batch.
std::string malformed(const ForwardRequest& request);
// A stage's reply: rows that are not whole floats, token ids that are not ids. How many rows and
// tokens the batch needs is the pipeline's to check.
std::string malformed(const ForwardReply& reply);
std::string malformed(const ReleaseRequest& request);
std::string malformed(const HoldPrefixRequest& request);
std::string malformed(const ReadKvRequest& request);
std::string malformed(const WriteKvRequest& request);
std::string malformed(const GenerateRequest& request);
std::string malformed(const ModelManifestRequest& request);
std::string malformed(const FetchTensorRequest& request);
// Handed-over state that cannot be taken (impossible positions or capacity, keys and values
// that are not whole rows of the same size), whether it comes in a WriteKv call or a ReadKv reply.
std::string malformed(const LayerKv& kv);
// A model manifest that cannot describe a GGUF file (no header, a file smaller than its header,
// a hash that is not 64 hex digits, tensor hashes that are not 32 bytes). Whether the header
// parses, and holds as many tensors as hashes, is the GGUF reader's to say.
std::string malformed(const ModelManifestReply& manifest);

// A sequence's handed-over state as a message and back (check it with malformed first): its
// rows in the element type they have (`half` for an f16 pool's), the same bytes back.
void to_message(const engine::LayerKv& kv, LayerKv& out);
engine::LayerKv from_message(const LayerKv& message);
// A batch and a stage's output for it, as messages and back (check them with malformed first).
void to_message(const engine::StageBatch& batch, ForwardRequest& out);
engine::StageBatch from_message(const ForwardRequest& message);
void to_message(const engine::StageOutput& output, ForwardReply& out);
engine::StageOutput from_message(const ForwardReply& message);
void to_message(const sampling::SamplingParams& params, SamplingParams& out);
sampling::SamplingParams from_message(const SamplingParams& message);
// Where a passed-on request left its state, as a message and back.
void to_message(const engine::HeldState& held, HeldState& out);
engine::HeldState from_message(const HeldState& message);
// What the leader's scheduler says of a request relayed to it, as the Generate stream carries
// it to the node that relayed it, and back: nullopt for the stream's own ACCEPTED, which no
// callback stands for.
void to_message(const engine::TokenEvent& event, GenerateEvent& out);
std::optional<engine::TokenEvent> from_message(const GenerateEvent& message);

}  // namespace strata::rpc
