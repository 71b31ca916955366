#include "api/request_observer.h"

#include <chrono>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "metrics/metrics.h"

namespace strata::api {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

struct GenerationInstruments {
  metrics::Counter& prompt_tokens;
  metrics::Counter& cached_tokens;
  metrics::Counter& generated_tokens;
  metrics::Histogram& first_token;
  metrics::Histogram& inter_token;
  metrics::Histogram& end_to_end;
};

GenerationInstruments& instruments() {
  metrics::Registry& r = metrics::process_registry();
  static GenerationInstruments kept{
      r.counter("strata_prompt_tokens_total", "Prompt tokens of the generations that entered at this node."),
      r.counter("strata_prompt_cached_tokens_total",
                "Of those prompt tokens, the ones whose keys and values came from the prefix cache."),
      r.counter("strata_generation_tokens_total", "Tokens generated for the requests that entered at this node."),
      r.histogram("strata_time_to_first_token_seconds", "From a generation's submission to its first token.",
                  metrics::seconds_buckets()),
      r.histogram("strata_inter_token_latency_seconds", "Between consecutive tokens of a generation.",
                  metrics::seconds_buckets()),
      r.histogram("strata_e2e_request_latency_seconds", "From a generation's submission to its end.",
                  metrics::seconds_buckets())};
  return kept;
}

// Written by the engine thread that runs the request's callbacks, read by GET /requests.
struct Timeline {
  std::mutex mutex;
  std::string request_id;
  int64_t started_unix_ms = 0;
  int prompt_tokens = 0;
  Clock::time_point submitted = Clock::now();
  std::optional<Clock::time_point> ended;
  std::string finish;
  std::optional<Clock::time_point> started;  // left the scheduler's queue
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> last_token;
  bool counted_prompt = false;
  int cached_tokens = 0;
  int generated_tokens = 0;
};

// The generations the dashboard shows, each updated by its callbacks.
class RecentRequests {
 public:
  static constexpr size_t kKept = 50;

  void add(std::shared_ptr<Timeline> timeline) {
    std::lock_guard lock(mutex_);
    kept_.push_front(std::move(timeline));
    if (kept_.size() > kKept) kept_.pop_back();
  }

  std::string json() {
    nlohmann::json requests = nlohmann::json::array();
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    for (const auto& t : kept_) {
      std::lock_guard timeline_lock(t->mutex);
      requests.push_back(
          {{"id", t->request_id},
           {"started_unix_ms", t->started_unix_ms},
           {"prompt_tokens", t->prompt_tokens},
           {"cached_tokens", t->cached_tokens},
           {"generated_tokens", t->generated_tokens},
           {"queued_seconds",
            t->started ? nlohmann::json(seconds_between(t->submitted, *t->started)) : nlohmann::json()},
           {"first_token_seconds",
            t->first_token ? nlohmann::json(seconds_between(t->submitted, *t->first_token)) : nlohmann::json()},
           {"seconds", seconds_between(t->submitted, t->ended.value_or(now))},
           {"finish", t->finish.empty() ? nlohmann::json() : nlohmann::json(t->finish)}});
    }
    return nlohmann::json{{"requests", requests}}.dump();
  }

 private:
  std::mutex mutex_;
  std::deque<std::shared_ptr<Timeline>> kept_;
};

RecentRequests& recent_requests() {
  static auto* kept = new RecentRequests;  // never destroyed: engine threads may end requests at exit
  return *kept;
}

std::string summary(const std::string& request_id, int prompt_tokens, const Timeline& t, engine::FinishReason reason,
                    const std::string& error, Clock::time_point now) {
  char text[256];
  std::snprintf(text, sizeof text, "generation ended (%s) after %.3f s: prompt %d tokens (%d cached), %d generated",
                engine::finish_reason_name(reason), seconds_between(t.submitted, now), prompt_tokens, t.cached_tokens,
                t.generated_tokens);
  std::string line = "request " + request_id + ": " + text;
  if (t.first_token) {
    std::snprintf(text, sizeof text, ", first after %.3f s", seconds_between(t.submitted, *t.first_token));
    line += text;
  }
  if (!error.empty()) line += ": " + error;
  return line;
}

}  // namespace

void count_answer(const std::string& endpoint, int status) {
  metrics::process_registry()
      .counter("strata_http_requests_total", "HTTP requests answered by this node, by endpoint and status.",
               {{"endpoint", endpoint}, {"status", std::to_string(status)}})
      .add();
}

engine::RequestCallbacks observed(engine::RequestCallbacks inner, int prompt_tokens, const std::string& request_id,
                                  std::function<void(const std::string&)> log) {
  GenerationInstruments& m = instruments();
  auto timeline = std::make_shared<Timeline>();
  timeline->request_id = request_id;
  timeline->prompt_tokens = prompt_tokens;
  timeline->started_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  recent_requests().add(timeline);
  engine::RequestCallbacks outer = inner;
  outer.on_token = [&m, timeline, prompt_tokens,
                    on_token = std::move(inner.on_token)](const engine::GeneratedToken& token) {
    const Clock::time_point now = Clock::now();
    std::unique_lock lock(timeline->mutex);
    if (!timeline->last_token) {
      timeline->first_token = now;
      m.first_token.observe(seconds_between(timeline->submitted, now));
    } else {
      m.inter_token.observe(seconds_between(*timeline->last_token, now));
    }
    timeline->last_token = now;
    // A prompt counts once computed, so that a request refused or cancelled in the queue
    // adds nothing; a request computed again counts once.
    if (!timeline->counted_prompt) {
      m.prompt_tokens.add(prompt_tokens);
      m.cached_tokens.add(token.cached_tokens);
      timeline->cached_tokens = token.cached_tokens;
      timeline->counted_prompt = true;
    }
    m.generated_tokens.add();
    ++timeline->generated_tokens;
    lock.unlock();
    return on_token(token);
  };
  // An embedding's prompt counts once computed, as a generation's does at its first token.
  outer.on_embedding = [&m, timeline, prompt_tokens, on_embedding = std::move(inner.on_embedding)](std::vector<float> e) {
    {
      std::lock_guard lock(timeline->mutex);
      if (!timeline->counted_prompt) {
        m.prompt_tokens.add(prompt_tokens);
        timeline->counted_prompt = true;
      }
    }
    if (on_embedding) on_embedding(std::move(e));
  };
  outer.on_started = [timeline, on_started = std::move(inner.on_started)] {
    {
      std::lock_guard lock(timeline->mutex);
      // A request that another scheduler goes on with starts again there: its first start counts.
      if (!timeline->started) timeline->started = Clock::now();
    }
    if (on_started) on_started();
  };
  outer.on_finish = [&m, timeline, prompt_tokens, request_id, log = std::move(log),
                     on_finish = std::move(inner.on_finish)](engine::FinishReason reason, const std::string& error) {
    const Clock::time_point now = Clock::now();
    m.end_to_end.observe(seconds_between(timeline->submitted, now));
    std::string line;
    {
      std::lock_guard lock(timeline->mutex);
      timeline->ended = now;
      timeline->finish = engine::finish_reason_name(reason);
      line = summary(request_id, prompt_tokens, *timeline, reason, error, now);
    }
    if (log) log(line);
    metrics::process_registry()
        .counter("strata_request_finished_total", "Generations ended, by why.", {{"reason", engine::finish_reason_name(reason)}})
        .add();
    on_finish(reason, error);
  };
  return outer;
}

std::string recent_requests_json() { return recent_requests().json(); }

}  // namespace strata::api
