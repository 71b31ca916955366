#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace strata::metrics {
namespace {

void add_to(std::atomic<double>& value, double amount) {
  double current = value.load(std::memory_order_relaxed);
  while (!value.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

// The shortest decimal that reads back as the same double; Go's ParseFloat spellings for the
// infinities and NaN, which the format takes.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string escaped(const std::string& text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string label_text(const Labels& labels, const std::pair<std::string, std::string>* extra = nullptr) {
  if (labels.empty() && extra == nullptr) return {};
  std::string out = "{";
  bool first = true;
  const auto put = [&](const std::pair<std::string, std::string>& label) {
    if (!first) out += ',';
    first = false;
    out += label.first + "=\"" + escaped(label.second, true) + '"';
  };
  for (const auto& label : labels) put(label);
  if (extra != nullptr) put(*extra);
  return out + '}';
}

}  // namespace

void Counter::add(double amount) {
  if (amount < 0) throw std::invalid_argument("a counter only grows");
  add_to(value_, amount);
}

void Gauge::add(double amount) { add_to(value_, amount); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
    throw std::invalid_argument("histogram bounds must ascend");
  }
}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    s.cumulative.push_back(running);
  }
  s.count = running + counts_.back();
  s.sum = sum_;
  return s;
}

std::vector<double> seconds_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,    5.0,   7.5,  10.0,  20.0,  40.0,  80.0, 120.0};
}

Exposition::Family& Exposition::family(const std::string& name, const char* type, const std::string& help) {
  auto [it, added] = families_.try_emplace(name);
  if (added) {
    order_.push_back(name);
    it->second.type = type;
    it->second.help = help;
  } else if (it->second.type != type) {
    throw std::logic_error("metric " + name + " written as a " + type + " and as a " + it->second.type);
  }
  return it->second;
}

void Exposition::counter(const std::string& name, const std::string& help, const Labels& labels, double value) {
  family(name, "counter", help).samples += name + label_text(labels) + ' ' + number(value) + '\n';
}

void Exposition::gauge(const std::string& name, const std::string& help, const Labels& labels, double value) {
  family(name, "gauge", help).samples += name + label_text(labels) + ' ' + number(value) + '\n';
}

void Exposition::histogram(const std::string& name, const std::string& help, const Labels& labels,
                           const Histogram::Snapshot& s) {
  std::string& samples = family(name, "histogram", help).samples;
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    const std::pair<std::string, std::string> le{"le", number(s.bounds[i])};
    samples += name + "_bucket" + label_text(labels, &le) + ' ' + std::to_string(s.cumulative[i]) + '\n';
  }
  const std::pair<std::string, std::string> inf{"le", "+Inf"};
  samples += name + "_bucket" + label_text(labels, &inf) + ' ' + std::to_string(s.count) + '\n';
  samples += name + "_sum" + label_text(labels) + ' ' + number(s.sum) + '\n';
  samples += name + "_count" + label_text(labels) + ' ' + std::to_string(s.count) + '\n';
}

std::string Exposition::text() const {
  std::string out;
  for (const std::string& name : order_) {
    const Family& f = families_.at(name);
    out += "# HELP " + name + ' ' + escaped(f.help, false) + '\n';
    out += "# TYPE " + name + ' ' + f.type + '\n';
    out += f.samples;
  }
  return out;
}

Registry::Instrument& Registry::find_or_add(const std::string& name, const std::string& help, const Labels& labels) {
  auto key = std::pair(name, labels);
  if (const auto it = by_key_.find(key); it != by_key_.end()) return *it->second;
  auto instrument = std::make_unique<Instrument>();
  instrument->name = name;
  instrument->help = help;
  instrument->labels = labels;
  Instrument* added = instrument.get();
  instruments_.push_back(std::move(instrument));
  by_key_.emplace(std::move(key), added);
  return *added;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Instrument& i = find_or_add(name, help, labels);
  if (!i.counter) {
    if (i.gauge || i.histogram) throw std::logic_error("metric " + name + " is not a counter");
    i.counter = std::make_unique<Counter>();
  }
  return *i.counter;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Instrument& i = find_or_add(name, help, labels);
  if (!i.gauge) {
    if (i.counter || i.histogram) throw std::logic_error("metric " + name + " is not a gauge");
    i.gauge = std::make_unique<Gauge>();
  }
  return *i.gauge;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                               const Labels& labels) {
  std::lock_guard lock(mutex_);
  Instrument& i = find_or_add(name, help, labels);
  if (!i.histogram) {
    if (i.counter || i.gauge) throw std::logic_error("metric " + name + " is not a histogram");
    i.histogram = std::make_unique<Histogram>(bounds);
  }
  return *i.histogram;
}

Registry::Registration::Registration(Registration&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)), id_(other.id_) {}

Registry::Registration& Registry::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    if (registry_ != nullptr) registry_->remove_collector(id_);
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

Registry::Registration::~Registration() {
  if (registry_ != nullptr) registry_->remove_collector(id_);
}

Registry::Registration Registry::add_collector(Collector collector) {
  std::lock_guard lock(collectors_mutex_);
  const uint64_t id = next_collector_++;
  collectors_.emplace(id, std::move(collector));
  return Registration(this, id);
}

void Registry::remove_collector(uint64_t id) {
  std::lock_guard lock(collectors_mutex_);
  collectors_.erase(id);
}

std::string Registry::text() const {
  Exposition out;
  {
    std::lock_guard lock(mutex_);
    for (const auto& i : instruments_) {
      if (i->counter) out.counter(i->name, i->help, i->labels, i->counter->value());
      if (i->gauge) out.gauge(i->name, i->help, i->labels, i->gauge->value());
      if (i->histogram) out.histogram(i->name, i->help, i->labels, i->histogram->snapshot());
    }
  }
  std::lock_guard lock(collectors_mutex_);
  for (const auto& [id, collect] : collectors_) collect(out);
  return out.text();
}

Registry& process_registry() {
  static auto* registry = new Registry;  // never destroyed: threads may count while the process exits
  return *registry;
}

}  // namespace strata::metrics
