#include "base/metrics.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace metro::metrics {

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> pairs) {
  std::string out;
  for (const auto& [k, v] : pairs) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  }
  return out;
}

std::string join(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  out += ',';
  out += b;
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

Exposition::Family& Exposition::family(std::string_view name, Type type, std::string_view help) {
  auto it = index_.find(std::string(name));
  if (it != index_.end()) return families_[it->second];
  index_.emplace(std::string(name), families_.size());
  families_.push_back(Family{std::string(name), type, std::string(help), {}});
  return families_.back();
}

void Exposition::line(std::string* out, std::string_view name, std::string_view labels, double value) {
  *out += name;
  if (!labels.empty()) {
    *out += '{';
    *out += labels;
    *out += '}';
  }
  *out += ' ';
  *out += format_value(value);
  *out += '\n';
}

void Exposition::counter(std::string_view name, std::string_view help, std::string_view labels, double value) {
  line(&family(name, Type::kCounter, help).samples, name, labels, value);
}

void Exposition::gauge(std::string_view name, std::string_view help, std::string_view labels, double value) {
  line(&family(name, Type::kGauge, help).samples, name, labels, value);
}

void Exposition::histogram(std::string_view name, std::string_view help, std::string_view labels,
                           const std::vector<double>& bounds, const std::vector<uint64_t>& cumulative,
                           uint64_t count, const double* sum) {
  std::string& out = family(name, Type::kHistogram, help).samples;
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < bounds.size() && i < cumulative.size(); ++i) {
    line(&out, bucket, join(labels, "le=\"" + format_value(bounds[i]) + "\""), static_cast<double>(cumulative[i]));
  }
  line(&out, bucket, join(labels, "le=\"+Inf\""), static_cast<double>(count));
  if (sum != nullptr) line(&out, std::string(name) + "_sum", labels, *sum);
  line(&out, std::string(name) + "_count", labels, static_cast<double>(count));
}

void Exposition::declare(std::string_view name, Type type, std::string_view help) { family(name, type, help); }

std::string Exposition::text() const {
  std::string out;
  size_t n = 0;
  for (const Family& f : families_) n += f.samples.size() + f.help.size() + 2 * f.name.size() + 32;
  out.reserve(n);
  for (const Family& f : families_) {
    const char* type = f.type == Type::kCounter ? "counter" : f.type == Type::kGauge ? "gauge" : "histogram";
    out += "# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + type + "\n";
    out += f.samples;
  }
  return out;
}

struct Registration::State {
  mutable std::mutex mu;
  uint64_t next_id = 1;
  std::map<uint64_t, Registry::Collector> collectors;  // ids increase: registration order
};

Registration::~Registration() { reset(); }

Registration::Registration(Registration&& o) noexcept : state_(std::move(o.state_)), id_(o.id_) { o.id_ = 0; }

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    reset();
    state_ = std::move(o.state_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

void Registration::reset() {
  if (auto s = state_.lock()) {
    std::lock_guard lock(s->mu);
    s->collectors.erase(id_);
  }
  state_.reset();
  id_ = 0;
}

Registry::Registry() : state_(std::make_shared<Registration::State>()) {}

Registration Registry::add(Collector collector) {
  std::lock_guard lock(state_->mu);
  const uint64_t id = state_->next_id++;
  state_->collectors.emplace(id, std::move(collector));
  return Registration(state_, id);
}

std::string Registry::render() const {
  Exposition e;
  std::lock_guard lock(state_->mu);  // a collector unregistering meanwhile waits for the scrape
  for (const auto& [id, c] : state_->collectors) c(e);
  return e.text();
}

}  // namespace metro::metrics
