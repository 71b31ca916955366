// The counters, gauges and histograms a node keeps about itself, and their Prometheus text
// exposition (format 0.0.4) that GET /metrics answers. Debian 12 packages no Prometheus client
// library for C++, so the text format is written here, after its specification.
//
// Instruments live in one registry per process, found by name and labels where the figure is
// measured; values that already live elsewhere (a KV pool's blocks, the cluster's members) are
// read at scrape time by collectors instead of being copied into instruments.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double amount);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets with ascending upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound: observations <= it
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bound, then one for above the last
  double sum_ = 0;
};

// Bucket bounds in seconds, from a millisecond to two minutes, for latencies.
std::vector<double> seconds_buckets();

// One scrape's text. Samples may be written in any order; each family's come out together,
// under its HELP and TYPE lines, in the order the families were first written.
class Exposition {
 public:
  void counter(const std::string& name, const std::string& help, const Labels& labels, double value);
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double value);
  void histogram(const std::string& name, const std::string& help, const Labels& labels,
                 const Histogram::Snapshot& snapshot);
  std::string text() const;

 private:
  struct Family {
    std::string type;
    std::string help;
    std::string samples;
  };
  Family& family(const std::string& name, const char* type, const std::string& help);

  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

class Registry {
 public:
  // The instrument of this name and labels, made on first use; references stay valid for the
  // registry's life. A name keeps the kind and help it was first made with.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});

  using Collector = std::function<void(Exposition&)>;
  // Keeps a collector running at every scrape while it lives.
  class Registration {
   public:
    Registration() = default;
    Registration(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration();

   private:
    Registry* registry_ = nullptr;
    uint64_t id_ = 0;
  };
  [[nodiscard]] Registration add_collector(Collector collector);

  std::string text() const;

 private:
  struct Instrument {
    std::string name;
    std::string help;
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  Instrument& find_or_add(const std::string& name, const std::string& help, const Labels& labels);
  void remove_collector(uint64_t id);

  // Two locks, never held together by the registry: a collector takes the lock of what it
  // reads, whose holder may meanwhile ask for an instrument.
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Instrument>> instruments_;
  std::map<std::pair<std::string, Labels>, Instrument*> by_key_;
  mutable std::mutex collectors_mutex_;
  uint64_t next_collector_ = 1;
  std::map<uint64_t, Collector> collectors_;
};

Registry& process_registry();

}  // namespace strata::metrics
