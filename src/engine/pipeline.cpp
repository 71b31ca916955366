#include "engine/pipeline.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace strata::engine {

Pipeline::Pipeline(std::vector<std::shared_ptr<Stage>> stages, OnResult on_result)
    : stages_(std::move(stages)), on_result_(std::move(on_result)) {
  if (stages_.empty()) throw std::invalid_argument("a pipeline needs at least one stage");
  const size_t last = stages_.size() - 1;
  for (size_t first = 0; first < stages_.size();) {
    size_t end = first + 1;  // of the run of stages that pass batches on, from `first`
    if (!stages_[first]->chain_node().empty()) {
      while (end < stages_.size() && !stages_[end]->chain_node().empty()) ++end;
    }
    Worker* head = workers_.emplace_back(std::make_unique<Worker>()).get();
    head->stage = first;
    head->released = {first};
    head->reaches_end = end - 1 == last;
    if (end - first > 1) {
      head->role = Worker::Role::Send;
      Worker* tail = workers_.emplace_back(std::make_unique<Worker>()).get();
      tail->role = Worker::Role::Receive;
      tail->stage = first;
      for (size_t i = first + 1; i < end; ++i) {
        head->then.push_back(stages_[i]->chain_node());
        tail->released.push_back(i);
      }
    }
    first = end;
  }
  workers_.front()->previous_done = true;
  for (size_t i = 0; i < workers_.size(); ++i) {
    workers_[i]->thread = std::thread([this, i] { work(i); });
  }
}

Pipeline::~Pipeline() { end({}); }

void Pipeline::end(std::vector<SequenceId> releasing) {
  if (ended_) return;
  ended_ = true;
  // Every stage first: a batch waiting on a node that is gone ends now, not at its deadline,
  // and no release waits for such a node.
  for (const auto& stage : stages_) stage->cancel();
  // The first worker stops last, after the release is queued: until then no worker can end
  // (each waits for the one before it).
  for (size_t i = workers_.size(); i-- > 0;) {
    if (i == 0) release(std::move(releasing));
    std::lock_guard lock(workers_[i]->mutex);
    workers_[i]->stopping = true;
  }
  for (auto& w : workers_) w->wake.notify_all();
  for (auto& w : workers_) w->thread.join();
}

void Pipeline::submit(uint64_t ticket, StageBatch batch) {
  Item item;
  item.ticket = ticket;
  if (!workers_.front()->reaches_end) {
    for (SequenceWork& work : batch.sequences) item.sampling.push_back(std::exchange(work.sampling, std::nullopt));
  }
  item.batch = std::move(batch);
  push(0, std::move(item));
}

void Pipeline::release(std::vector<SequenceId> ids) {
  if (ids.empty()) return;
  Item item;
  item.release = true;
  item.ids = std::move(ids);
  push(0, std::move(item));
}

void Pipeline::push(size_t worker, Item item) {
  Worker& w = *workers_[worker];
  {
    std::lock_guard lock(w.mutex);
    w.queue.push_back(std::move(item));
  }
  w.wake.notify_one();
}

Pipeline::Result Pipeline::run(Worker& w, Item& item) {
  Result result{item.ticket, {}, {}};
  try {
    switch (w.role) {
      case Worker::Role::Forward:
        result.output = stages_[w.stage]->forward(item.batch);
        break;
      case Worker::Role::Send:
        item.batch.then = w.then;
        stages_[w.stage]->send(item.batch);
        break;
      case Worker::Role::Receive:
        result.output = stages_[w.stage]->receive();
        break;
    }
  } catch (const StageLost& e) {
    result.error = e.what();
    result.lost = true;
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

void Pipeline::work(size_t worker) {
  Worker& w = *workers_[worker];
  const bool last = worker + 1 == workers_.size();
  while (true) {
    Item item;
    {
      std::unique_lock lock(w.mutex);
      w.wake.wait(lock, [&] { return (w.stopping && w.previous_done) || !w.queue.empty(); });
      if (w.queue.empty()) {
        lock.unlock();
        if (!last) {
          Worker& next = *workers_[worker + 1];
          {
            std::lock_guard next_lock(next.mutex);
            next.previous_done = true;
          }
          next.wake.notify_all();
        }
        return;
      }
      item = std::move(w.queue.front());
      w.queue.pop_front();
      // A stopping pipeline still releases every sequence's state, but computes nothing more;
      // its releases go as one call per stage (a cancelled remote stage's each takes a thread).
      if (w.stopping && !item.release) continue;
      if (w.stopping) {
        for (Item& queued : w.queue) {
          if (queued.release) item.ids.insert(item.ids.end(), queued.ids.begin(), queued.ids.end());
        }
        w.queue.clear();
      }
    }
    if (item.release) {
      for (size_t stage : w.released) {
        try {
          stages_[stage]->release(item.ids);
        } catch (const std::exception&) {
          // A stage that cannot be reached drops its sequences when it leaves the placement.
        }
      }
      if (!last) push(worker + 1, std::move(item));
      continue;
    }
    Result result = run(w, item);
    if (last || !result.error.empty()) {
      on_result_(std::move(result));
      continue;
    }
    if (w.role != Worker::Role::Send) item.batch.hidden = std::move(result.output.rows);
    if (workers_[worker + 1]->reaches_end) {
      for (size_t i = 0; i < item.sampling.size(); ++i) item.batch.sequences[i].sampling = std::move(item.sampling[i]);
    }
    push(worker + 1, std::move(item));
  }
}

}  // namespace strata::engine
