// A metrics registry each layer registers its own families into, and their Prometheus text
// exposition (format 0.0.4).
//
// A layer registers a collector: a function that, at scrape time, writes the current value
// of each of its series into an Exposition. Series of one family may come from several
// collectors (one per engine, each with its own `model` label): the exposition groups them
// under one HELP/TYPE header. Collectors run on the scraping thread, so they read
// thread-safe snapshots, never another thread's private state.
//
//   metrics::Registry registry;
//   metrics::Registration r = registry.add([&](metrics::Exposition& e) {
//     e.gauge("metro_kv_blocks_used", "KV cache blocks in use.", metrics::labels({{"model", name}}), used);
//   });
//   std::string text = registry.render();   // r unregisters when it is destroyed
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace metro::metrics {

enum class Type : uint8_t { kCounter, kGauge, kHistogram };

// `name="value",...` with values escaped; the form Exposition takes labels in.
std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> pairs);
// Two label strings as one (either may be empty).
std::string join(std::string_view a, std::string_view b);
std::string escape_label_value(std::string_view v);
std::string format_value(double v);

class Exposition {
 public:
  void counter(std::string_view name, std::string_view help, std::string_view labels, double value);
  void gauge(std::string_view name, std::string_view help, std::string_view labels, double value);
  // `cumulative[i]` counts observations <= bounds[i] (one per bound); `count` all of them.
  // Without a sum (null) the family has no _sum series.
  void histogram(std::string_view name, std::string_view help, std::string_view labels,
                 const std::vector<double>& bounds, const std::vector<uint64_t>& cumulative, uint64_t count,
                 const double* sum);
  // A family's header even when no series has a sample yet (e.g. a counter by reason).
  void declare(std::string_view name, Type type, std::string_view help);

  std::string text() const;

 private:
  struct Family {
    std::string name;
    Type type;
    std::string help;
    std::string samples;  // lines, in the order written
  };
  Family& family(std::string_view name, Type type, std::string_view help);
  static void line(std::string* out, std::string_view name, std::string_view labels, double value);

  std::vector<Family> families_;  // in the order first written
  std::unordered_map<std::string, size_t> index_;
};

class Registry;

// A label value several threads read while one may change it: a collector that reads it at
// every scrape follows a rename (a served model swapped with its variant) without being
// registered again, so no scrape ever shows both names.
class SharedLabel {
 public:
  explicit SharedLabel(std::string value) : value_(std::move(value)) {}
  std::string get() const {
    std::lock_guard lock(mu_);
    return value_;
  }
  void set(std::string value) {
    std::lock_guard lock(mu_);
    value_ = std::move(value);
  }

 private:
  mutable std::mutex mu_;
  std::string value_;
};

// Keeps a collector registered; removes it when destroyed (whichever of the two goes first).
class Registration {
 public:
  Registration() = default;
  ~Registration();
  Registration(Registration&& o) noexcept;
  Registration& operator=(Registration&& o) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  friend class Registry;
  struct State;
  Registration(std::weak_ptr<State> state, uint64_t id) : state_(std::move(state)), id_(id) {}
  void reset();
  std::weak_ptr<State> state_;
  uint64_t id_ = 0;
};

class Registry {
 public:
  using Collector = std::function<void(Exposition&)>;

  Registry();
  // Collectors run in registration order. Thread-safe.
  [[nodiscard]] Registration add(Collector collector);
  // Runs every collector. Thread-safe; collectors must not call back into the registry.
  std::string render() const;

 private:
  std::shared_ptr<Registration::State> state_;
};

}  // namespace metro::metrics
