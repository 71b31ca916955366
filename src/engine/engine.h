// Runs a model with continuous batching over a pipeline of stages: the whole model on this
// node is the one-stage case; a cluster's stages are layer ranges on several nodes. Each step
// of a group of sequences is one batched pass through every stage (prompt chunks and single
// decode tokens together), new requests join between steps, and with S stages up to S groups
// are in flight at once, so every stage has work.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "constrain/matcher.h"
#include "engine/drafter.h"
#include "engine/generator.h"
#include "engine/pipeline.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace strata::engine {

struct EngineOptions {
  int context_size = 0;       // 0: the model's trained context (required with stages)
  int max_parallel = 4;       // sequences decoded together
  int max_queued = 64;        // waiting requests beyond that are refused
  int threads = 0;            // 0: all cores (the whole-model engine's pool)
  int prefill_chunk = 256;    // prompt tokens per step, so long prompts do not stall decoding
  // How long requests wait for a new pipeline (replace_pipeline) when a stage is lost before
  // they end with its error; 0: they end at once.
  std::chrono::milliseconds replay_wait{0};
  // A new sequence starts after the longest prefix of whole blocks that every stage caches.
  bool prefix_cache = true;
  model::KvType kv_type = model::KvType::F16;  // of the whole-model engine's pool and a node's
  uint64_t kv_memory = 0;  // bytes of such a pool; 0: max_parallel full contexts
  // Positions the model's sliding-window layers see (Config::sliding_window), whose blocks a
  // sequence needs only of its window; 0: none. The whole-model engine takes its model's.
  int sliding_window = 0;
  // The stages of the pipeline a request's HeldState names, from which its state moves to this
  // engine's stages; none (or no function): the request is computed again.
  std::function<std::vector<std::shared_ptr<Stage>>(uint64_t pipeline)> held_stages;
  // The first sequence id: schedulers whose sequences share stages (a cluster's leaders, one
  // after another) start far apart, so that one's id never names the other's sequence.
  SequenceId first_sequence_id = 1;
  // The tokens' bytes, which requests with a grammar need; without it they are refused.
  std::shared_ptr<const constrain::Vocabulary> vocabulary;
  // The width of the model's hidden rows, which embedding requests pool; 0 (a pipeline's
  // default): they are refused. The whole-model engine takes its model's.
  int embedding_dim = 0;
  // Speculative decoding: a decoding sequence's step also feeds up to `draft_max` tokens that
  // the drafter guesses, which the last stage checks (sampling::choose_along), so that a step
  // may give several tokens, the same as one at a time. None: one token a step. A request with
  // a grammar sends the grammar's mask for each draft's row, and drafts only what it allows.
  std::shared_ptr<const Drafter> drafter;
  int draft_max = 8;
  // A batch of more decoding sequences takes no drafts: it is bound by compute already, where
  // a draft's row costs about what it may save.
  int drafting_sequences = 2;

  // The most inputs one step feeds a sequence: a prompt chunk, or a token and its drafts.
  int step_inputs() const { return std::max(prefill_chunk, drafter ? draft_max + 1 : 1); }
};

class Engine final : public Generator {
 public:
  // The whole model on this node: one local stage, on a pool of `options.threads`.
  // `is_end_of_generation` tells which sampled tokens end a request (EOS, EOT, ...).
  Engine(std::shared_ptr<model::Model> model, std::function<bool(Token)> is_end_of_generation,
         EngineOptions options);
  // A pipeline: the first stage embeds tokens, the last holds the head over `vocab_size` and
  // chooses each sequence's next token there, with the sampling step the engine sends along.
  Engine(std::vector<std::shared_ptr<Stage>> stages, int vocab_size,
         std::function<bool(Token)> is_end_of_generation, EngineOptions options);
  ~Engine() override;

  ModelLimits limits() const override;
  bool submit(GenerationRequest request, RequestCallbacks callbacks) override;
  void shutdown() override;
  // Like shutdown, but the requests in flight end with `reason` (Error or Lost) and `why`.
  void abort(FinishReason reason, const std::string& why);
  // Like abort, but first the batches in flight finish; then each running request whose
  // callbacks take it is passed on (on_passed_on) with the state its stages hold, which stays
  // there under `pipeline`'s name for the next scheduler to move. Others end Lost with `why`.
  void pass_on(uint64_t pipeline, const std::string& why);
  // Runs every request from now on through `stages`, between steps, and goes on with the same
  // samplers, so that every text is the same as if nothing had changed.
  // Without `hand_over` (a stage was lost), batches still in the old pipeline are dropped and
  // each running request is computed again on the new stages from its prompt and the tokens it
  // has generated. With it (the old stages all still run: a node leaves or joins), the batches
  // in flight finish first, then each running sequence's keys and values move from the old
  // stages to the new ones, so nothing is computed again; a sequence whose state cannot move
  // is computed again. The old pipeline releases every sequence it ran, without waiting for
  // stages that are gone, so `stages` must be other objects than the old pipeline's.
  void replace_pipeline(std::vector<std::shared_ptr<Stage>> stages, bool hand_over = false);
  // Sequences that a pipeline switch moved with their state, and that it computed again; a
  // request that another scheduler ran part-way counts as one of them when it starts here.
  struct SwitchCounts {
    uint64_t handed_over = 0;
    uint64_t recomputed = 0;
  };
  SwitchCounts switch_counts() const;
  // Running sequences whose state the stages let go, back to the queue's front, because the KV
  // pools had no room for their next step; each is computed again when room returns.
  uint64_t preemptions() const;
  // Speculative decoding so far: steps that carried drafts, drafts sent, and drafts the last
  // stage confirmed (each one a token that came without a step of its own).
  struct SpeculationCounts {
    uint64_t steps = 0;
    uint64_t drafted = 0;
    uint64_t accepted = 0;
  };
  SpeculationCounts speculation() const;
  // Requests waiting in the queue, and sequences running (in the pipeline or between steps).
  struct Load {
    int waiting = 0;
    int running = 0;
  };
  Load load();

 private:
  struct Sequence;
  // A batch in the pipeline: its sequences, how many inputs each fed, and the drafts among
  // them (its last inputs).
  struct InFlight {
    std::vector<Sequence*> owners;
    std::vector<int> counts;
    std::vector<std::vector<Token>> drafts;
  };
  void start(std::vector<std::shared_ptr<Stage>> stages);
  // shutdown, abort and pass_on: ends the loop and waits for it.
  void stop(FinishReason reason, const std::string& why, std::optional<uint64_t> passing_on);
  std::unique_ptr<Pipeline> make_pipeline(std::vector<std::shared_ptr<Stage>> stages);
  // Loop thread: takes a replacement pipeline, and ends requests that waited too long for one.
  struct NextPipeline {
    std::vector<std::shared_ptr<Stage>> stages;
    bool hand_over = false;
  };
  void switch_pipeline(std::vector<std::unique_ptr<Sequence>>& active, NextPipeline next);
  // Moves the first `positions` inputs' state of sequence `from_id` on stages `from` to
  // sequence `seq` on stages `to`; false when it cannot (what it wrote may stay there).
  bool move_state(const std::vector<std::shared_ptr<Stage>>& from, SequenceId from_id, int positions,
                  const std::vector<std::shared_ptr<Stage>>& to, const Sequence& seq);
  // A request passed on by another scheduler takes its held state over; false when it cannot.
  bool take_over_held(Sequence& seq);
  // Ends the loop: every request still here finishes, or is passed on (pass_on).
  void end_all(std::vector<std::unique_ptr<Sequence>>& active);
  void run_loop();
  // Packs ready sequences into one batch for the pipeline; false when none is ready.
  bool launch_batch(const std::vector<std::unique_ptr<Sequence>>& active);
  // The drafts for a decoding sequence's next step: as many as the drafter has, the batch's
  // `budget` allows, the sequence's drafts have earned, the request may still use and the
  // smallest pool has room for beside the running sequences.
  std::vector<Token> drafts_for(Sequence& seq, const std::vector<std::unique_ptr<Sequence>>& active, int budget);
  void complete(const InFlight& batch, const Pipeline::Result& result);
  void finish(Sequence& seq, FinishReason reason, const std::string& error = {});
  // The stages let the sequence's state go, after the batches already sent to them; should it
  // go on, it is computed again.
  void release_state(Sequence& seq);
  // Before a launch: the sequences that cannot fit the smallest pool even alone end with an
  // error; then, while the running ones need more blocks than it has, the newest that is not
  // in flight goes back to the queue's front.
  void make_room(std::vector<std::unique_ptr<Sequence>>& active);
  // Blocks that a sequence needs once it has fed all it has: of the full-attention layers'
  // pools, every position's; of the sliding-window layers', its window's and a step's.
  model::KvBlockCounts blocks_needed(const Sequence& seq) const;
  model::KvBlockCounts blocks_for_positions(int positions) const;
  model::KvBlockCounts blocks_needed(const std::vector<std::unique_ptr<Sequence>>& active) const;
  // Blocks that a stage may still hold for sequences released while batches were in flight.
  model::KvBlockCounts blocks_releasing() const;
  // Whether `more` blocks fit in the smallest pools beside both, so that a new sequence may be
  // admitted, and start.
  bool room_for(const std::vector<std::unique_ptr<Sequence>>& active, model::KvBlockCounts more) const;
  // Before a sequence's first batch on a pipeline: the positions every stage holds for it
  // from its cache, which it does not compute again.
  void start_sequence(Sequence& seq);
  // Sets pool_blocks_: the smallest stage pools of the pipeline, in blocks; none, and another
  // try kPoolProbeRetry later, when a stage cannot say.
  void probe_pool_blocks();
  // Takes the queued sequences whose request was cancelled out of the queue (mutex_ held).
  std::vector<std::unique_ptr<Sequence>> take_cancelled();
  void finish_cancelled(std::vector<std::unique_ptr<Sequence>> cancelled);

  std::unique_ptr<tensor::ThreadPool> own_pool_;  // the whole-model engine's
  int vocab_size_;
  std::function<bool(Token)> is_end_of_generation_;
  EngineOptions options_;
  std::unique_ptr<Pipeline> pipeline_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::deque<Pipeline::Result> results_;
  int running_ = 0;  // sequences the loop holds, finished ones excluded
  bool stopping_ = false;
  std::string abort_reason_;  // set with stopping_ by abort
  FinishReason abort_finish_ = FinishReason::Error;  // with abort_reason_
  std::optional<uint64_t> passing_on_;  // set with stopping_ by pass_on: the pipeline's name
  std::optional<NextPipeline> next_pipeline_;
  std::atomic<uint64_t> handed_over_{0};
  std::atomic<uint64_t> recomputed_{0};
  std::atomic<uint64_t> preemptions_{0};
  std::atomic<uint64_t> speculative_steps_{0};
  std::atomic<uint64_t> drafted_{0};
  std::atomic<uint64_t> accepted_{0};
  std::thread loop_;

  // Owned by the loop thread.
  // Sequences are admitted, and launched, while the blocks they need (blocks_needed) fit in
  // the smallest stage pools, so that no pool runs out in a step; as they grow, the newest go
  // back to the queue (make_room).
  std::optional<model::KvBlockCounts> pool_blocks_;  // probed on the loop thread for each pipeline; none: unknown yet
  static constexpr std::chrono::seconds kPoolProbeRetry{1};
  std::chrono::steady_clock::time_point next_pool_probe_;
  SequenceId next_sequence_id_;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, InFlight> in_flight_;
  // A released sequence's blocks, which a stage may hold until the batches launched before its
  // release (tickets below `next_ticket`) are through it. A new sequence's cached prefix is
  // pinned on every stage at its start, outside the pipeline's order, so these count against
  // its start; the next step of a running sequence reaches each stage after the release.
  struct Releasing {
    uint64_t next_ticket;
    model::KvBlockCounts blocks;
  };
  std::vector<Releasing> releasing_;
  // Every stage has let its blocks go: the batches in flight at its release are back.
  bool released_everywhere(const Releasing& r) const;
  // A stage was lost: nothing is launched until a new pipeline comes or the wait is over.
  bool broken_ = false;
  std::chrono::steady_clock::time_point broken_since_;
  std::string broken_error_;
};

}  // namespace strata::engine
