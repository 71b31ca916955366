// Runs batches through an ordered list of stages with one worker thread per stage, so that
// several batches are in flight at once, each at a different stage: with S stages on S nodes,
// all S compute at the same time. A run of stages that pass batches on themselves
// (Stage::chain_node) is a chain: one worker sends each batch to its first stage, naming the
// others, and another receives the last one's output from it, so that the rows go from node to
// node and only the run's output comes back.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/stage.h"

namespace strata::engine {

class Pipeline {
 public:
  // What the last stage returned for a batch, or why a stage failed it.
  struct Result {
    uint64_t ticket = 0;
    StageOutput output;
    std::string error;  // empty on success
    bool lost = false;  // a stage is gone (StageLost): the batch may be run again elsewhere
  };
  // Called on a worker thread once per submitted batch.
  using OnResult = std::function<void(Result)>;

  Pipeline(std::vector<std::shared_ptr<Stage>> stages, OnResult on_result);
  ~Pipeline();  // end({})
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int depth() const { return static_cast<int>(stages_.size()); }
  const std::vector<std::shared_ptr<Stage>>& stages() const { return stages_; }
  void submit(uint64_t ticket, StageBatch batch);
  // Releases the sequences on every stage, after the work already queued there.
  void release(std::vector<SequenceId> ids);
  // Cancels every stage (Stage::cancel), waits for the batches being computed, drops queued
  // ones, and completes the releases queued and then `releasing`. Nothing more runs after.
  void end(std::vector<SequenceId> releasing);

 private:
  struct Item {
    bool release = false;
    uint64_t ticket = 0;
    StageBatch batch;
    // Only the last stage chooses tokens: the batch's sampling steps (a grammar's flags among
    // them) pass the others by, kept here in `batch.sequences` order.
    std::vector<std::optional<sampling::SamplingStep>> sampling;
    std::vector<SequenceId> ids;
  };
  struct Worker {
    enum class Role {
      Forward,  // the stage's forward
      Send,     // the first stage of a chain: send, naming the chain's other stages
      Receive,  // the chain's output, from its first stage
    };
    Role role = Role::Forward;
    size_t stage = 0;  // the stage it calls: for a chain, its first
    std::vector<size_t> released;  // the stages whose releases it makes
    std::vector<std::string> then;  // Send: the chain's other stages' nodes
    bool reaches_end = false;  // what it sends is computed through the last stage: it takes the sampling steps
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Item> queue;
    bool stopping = false;
    // The worker before it has ended, so that nothing more comes: a stopping worker still
    // passes on every release it has, and the next one must be there to take it.
    bool previous_done = false;
    std::thread thread;
  };

  void push(size_t worker, Item item);
  void work(size_t worker);
  // What a worker does with one batch: its output, or why it has none.
  Result run(Worker& w, Item& item);

  std::vector<std::shared_ptr<Stage>> stages_;
  OnResult on_result_;
  bool ended_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace strata::engine
