// One stream's decode speed of a tensor-parallel group in one process (model/tensor_share.h)
// against one Model: a Model on one thread, a group of `members` members with one thread each,
// then a Model on `members` threads (as many as the group's), in turns, `reps` times, each run a
// prompt of 8 tokens and then `tokens` greedy decode steps on a fresh sequence. Random weights
// of a real shape serve (`strata gguf synth`, a few of TinyLlama's layers with --layers).
// Prints each run's decode tokens/s, the medians and the group's median ratios to both Models,
// the bytes member 0 sent to the gathers per decode step, where the group's gathers took their
// time, and checks that the group and the threaded Model chose the Model's tokens. With
// `sockets` the members gather over Unix socket pairs (parallel::SocketExchange) rather than in
// memory; with `tls`, over TLS on the loopback interface through parallel::GroupLinks, as the
// members on real nodes do.
//   tensor_parallel_bench MODEL.gguf [tokens] [reps] [members] [memory|sockets|tls]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "model/exchange.h"
#include "model/model.h"
#include "model/tensor_share.h"
#include "parallel/group_links.h"
#include "parallel/socket_exchange.h"
#include "rpc/tls.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// When a member reached a gather, and when it left it.
struct Visit {
  Clock::time_point arrived;
  Clock::time_point left;
};

// A member's exchange that counts the bytes of its parts and notes its visits to the gathers.
class CountingExchange final : public model::Exchange {
 public:
  explicit CountingExchange(model::Exchange& inner) : inner_(inner) {}
  int member() const override { return inner_.member(); }
  int size() const override { return inner_.size(); }
  void all_gather_bytes(std::span<const std::byte> mine, std::span<const size_t> widths, size_t rows,
                        std::span<std::byte> full) override {
    sent += mine.size();
    const Clock::time_point arrived = Clock::now();
    inner_.all_gather_bytes(mine, widths, rows, full);
    visits.push_back({arrived, Clock::now()});
  }
  void read_next(std::span<const std::span<const std::byte>> regions) override { inner_.read_next(regions); }
  void abort() override { inner_.abort(); }
  uint64_t sent = 0;
  std::vector<Visit> visits;

 private:
  model::Exchange& inner_;
};

struct Decode {
  std::vector<model::Token> tokens;  // the greedy choices
  double tokens_per_second = 0.0;
  double bytes_per_token = 0.0;  // sent to the gathers, by a member
};

// One member's run (or the Model's, without `exchange`): the prompt, then `steps` greedy
// decode steps, timed.
Decode decode(model::Model& m, int steps, const CountingExchange* exchange, int threads = 1) {
  tensor::ThreadPool pool(threads);
  auto kv = m.new_sequence(8 + steps);
  std::vector<model::Token> input{1, 15, 300, 4000, 52, 9, 777, 2048};
  Decode run;
  Clock::time_point start;
  uint64_t sent_before = 0;
  for (int step = 0; step <= steps; ++step) {
    if (step == 1) {  // after the prompt
      start = Clock::now();
      if (exchange != nullptr) sent_before = exchange->sent;
    }
    model::SequenceSlice slice{kv.get(), static_cast<int>(input.size()), model::SliceOutput::LastLogits};
    const std::vector<float> logits = m.forward({&slice, 1}, input, {}, pool);
    const auto best = static_cast<model::Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(best);
    input = {best};
  }
  run.tokens_per_second = steps / std::chrono::duration<double>(Clock::now() - start).count();
  if (exchange != nullptr) run.bytes_per_token = static_cast<double>(exchange->sent - sent_before) / steps;
  return run;
}

// Where the group's gathers of one run took their time, in microseconds a gather on average:
// the last member's arrival after the first's (one member waiting for a slower one), and the
// last member's departure after the last arrival (moving the parts once all are there).
struct GatherTimes {
  double waiting = 0.0;
  double moving = 0.0;
};

GatherTimes gather_times(const std::vector<std::unique_ptr<CountingExchange>>& members) {
  GatherTimes times;
  const size_t gathers = members.front()->visits.size();
  for (size_t g = 0; g < gathers; ++g) {
    Clock::time_point first = Clock::time_point::max(), last_arrival = Clock::time_point::min(),
                      last_departure = Clock::time_point::min();
    for (const auto& member : members) {
      const Visit& visit = member->visits[g];
      first = std::min(first, visit.arrived);
      last_arrival = std::max(last_arrival, visit.arrived);
      last_departure = std::max(last_departure, visit.left);
    }
    times.waiting += std::chrono::duration<double, std::micro>(last_arrival - first).count();
    times.moving += std::chrono::duration<double, std::micro>(last_departure - last_arrival).count();
  }
  times.waiting /= static_cast<double>(std::max<size_t>(gathers, 1));
  times.moving /= static_cast<double>(std::max<size_t>(gathers, 1));
  return times;
}

// Each member's exchange over `transport`, "sockets" or "tls". `links` keeps the GroupLinks
// that TLS members joined through.
std::vector<std::unique_ptr<model::Exchange>> exchanges(const std::string& transport, int members,
                                                        std::vector<std::unique_ptr<parallel::GroupLinks>>& links) {
  std::vector<std::unique_ptr<model::Exchange>> joined(static_cast<size_t>(members));
  if (transport == "sockets") {
    int m = 0;
    for (const std::vector<int>& peers : parallel::socket_pair_mesh(members)) {
      joined[static_cast<size_t>(m)] = std::make_unique<parallel::SocketExchange>(m, peers);
      ++m;
    }
  } else if (transport == "tls") {
    const rpc::LinkSecurity security("bench secret");
    std::vector<std::string> addresses;
    for (int m = 0; m < members; ++m) {
      links.push_back(std::make_unique<parallel::GroupLinks>(
          "127.0.0.1", 0,
          parallel::LinkCredentials{security.authority_pem(), security.certificate_pem(), security.private_key_pem()}));
      addresses.push_back("127.0.0.1:" + std::to_string(links.back()->port()));
    }
    std::vector<std::thread> joins;
    for (int m = 0; m < members; ++m) {
      joins.emplace_back([&, m] {
        joined[static_cast<size_t>(m)] = links[static_cast<size_t>(m)]->join("bench", m, addresses, std::chrono::seconds(10));
      });
    }
    for (std::thread& j : joins) j.join();
  }
  return joined;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [tokens] [reps] [members] [memory|sockets|tls]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 32;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const int members = argc > 4 ? std::atoi(argv[4]) : 2;
  const std::string transport = argc > 5 ? argv[5] : "memory";
  if (transport != "memory" && transport != "sockets" && transport != "tls") {
    std::fprintf(stderr, "transport %s is none of memory, sockets, tls\n", transport.c_str());
    return 2;
  }
  const std::shared_ptr<const gguf::File> file = gguf::File::open(argv[1]);
  const model::Config config = model::Config::from_gguf(*file);
  const model::LayerRange range{0, config.layer_count};
  const auto whole = model::Model::load(file, range);
  const std::vector<model::TensorShare> shares =
      model::plan_tensor_shares(config, std::vector<double>(static_cast<size_t>(members), 1.0));
  model::LocalGroup group(members);
  std::vector<std::unique_ptr<parallel::GroupLinks>> links;
  const std::vector<std::unique_ptr<model::Exchange>> linked =
      transport == "memory" ? std::vector<std::unique_ptr<model::Exchange>>() : exchanges(transport, members, links);
  std::vector<std::unique_ptr<CountingExchange>> counted;
  std::vector<std::unique_ptr<model::Model>> parts;
  for (int m = 0; m < members; ++m) {
    counted.push_back(
        std::make_unique<CountingExchange>(linked.empty() ? group.member(m) : *linked[static_cast<size_t>(m)]));
    parts.push_back(model::Model::load_share(file, range, shares, *counted.back()));
  }

  std::printf("%d layers, %d decode steps per run, %d members of 1 thread (%s) against 1 Model of 1 thread and of %d\n",
              config.layer_count, steps, members, transport.c_str(), members);
  std::vector<double> alone, together, threaded, ratios_alone, ratios_threaded;
  bool same_tokens = true;
  for (int rep = 0; rep < reps; ++rep) {
    const Decode one = decode(*whole, steps, nullptr);
    std::vector<Decode> runs(static_cast<size_t>(members));
    std::vector<std::thread> threads;
    for (auto& member : counted) member->visits.clear();
    for (int m = 0; m < members; ++m) {
      threads.emplace_back([&, m] { runs[m] = decode(*parts[m], steps, counted[m].get()); });
    }
    for (std::thread& t : threads) t.join();
    const Decode many = decode(*whole, steps, nullptr, members);
    for (const Decode& run : runs) same_tokens = same_tokens && run.tokens == one.tokens;
    same_tokens = same_tokens && many.tokens == one.tokens;
    alone.push_back(one.tokens_per_second);
    together.push_back(runs[0].tokens_per_second);
    threaded.push_back(many.tokens_per_second);
    ratios_alone.push_back(together.back() / alone.back());
    ratios_threaded.push_back(together.back() / threaded.back());
    const GatherTimes gathers = gather_times(counted);
    std::printf("rep %d: model %.2f tokens/s, group %.2f (%.2fx), model on %d threads %.2f (group %.2fx); "
                "member 0 gathered %.0f bytes a token; a gather: %.1f us waiting for the last member, %.1f us "
                "moving the parts\n",
                rep, alone.back(), together.back(), ratios_alone.back(), members, threaded.back(),
                ratios_threaded.back(), runs[0].bytes_per_token, gathers.waiting, gathers.moving);
  }
  std::printf("median: model %.2f tokens/s, group %.2f, model on %d threads %.2f; median ratios: the group %.2fx "
              "the model, %.2fx the model on %d threads\n",
              median(alone), median(together), members, median(threaded), median(ratios_alone),
              median(ratios_threaded), members);
  if (!same_tokens) {
    std::printf("the group or the threaded model chose other tokens than the model\n");
    return 1;
  }
  return 0;
}
