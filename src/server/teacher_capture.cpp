#include "server/teacher_capture.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <random>
#include <system_error>

#include "base/log.h"
#include "server/json_util.h"

namespace metro::server {

namespace {

constexpr int64_t kLineEstimate = 320;  // a sample's JSON line, for the size bounds

template <class T>
void put(std::string* out, T v) {
  static_assert(sizeof(T) == 4);
  char b[4];
  std::memcpy(b, &v, 4);  // the machines metro runs on are little-endian
  out->append(b, 4);
}

}  // namespace

Expected<std::unique_ptr<TeacherCapture>> TeacherCapture::open(CaptureConfig cfg) {
  if (cfg.dir.empty()) return invalid_argument("--capture-teacher needs a directory");
  if (cfg.top_k < 1 || cfg.top_k > 20) return invalid_argument("--capture-top-k is from 1 to 20");
  auto bad_share = [](double r) { return !(r >= 0.0 && r <= 1.0); };
  if (bad_share(cfg.rate)) return invalid_argument("--capture-rate is a share from 0 to 1");
  for (const auto& [tenant, r] : cfg.tenant_rates) {
    if (bad_share(r)) return invalid_argument("tenant '" + tenant + "': capture= is a share from 0 to 1");
  }
  if (cfg.max_bytes <= 0) return invalid_argument("--capture-max-bytes must be positive");
  std::error_code ec;
  std::filesystem::create_directories(cfg.dir, ec);
  if (ec) return invalid_argument("--capture-teacher: cannot make " + cfg.dir + ": " + ec.message());
  std::unique_ptr<TeacherCapture> c(new TeacherCapture(std::move(cfg)));
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const std::string base = (std::filesystem::path(c->cfg_.dir) /
                            ("teacher-" + std::string(stamp) + "-" + std::to_string(::getpid())))
                               .string();
  c->jsonl_path_ = base + ".jsonl";
  c->bin_path_ = base + ".bin";
  c->bin_.open(c->bin_path_, std::ios::binary | std::ios::app);
  c->jsonl_.open(c->jsonl_path_, std::ios::app);
  if (!c->bin_ || !c->jsonl_) return invalid_argument("--capture-teacher: cannot write in " + c->cfg_.dir);
  c->bin_.seekp(0, std::ios::end);
  c->written_bytes_ = static_cast<int64_t>(c->bin_.tellp());
  c->writer_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

TeacherCapture::TeacherCapture(CaptureConfig cfg) : cfg_(std::move(cfg)) {}

TeacherCapture::~TeacherCapture() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

bool TeacherCapture::sample(const std::string& tenant) {
  double rate = cfg_.rate;
  if (!cfg_.tenant_rates.empty()) {
    auto it = cfg_.tenant_rates.find(tenant);
    if (it == cfg_.tenant_rates.end()) return false;
    rate = it->second;
  }
  if (rate >= 1.0) return true;
  if (rate <= 0.0) return false;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return static_cast<double>(rng() >> 11) * 0x1.0p-53 < rate;
}

int64_t TeacherCapture::size_of(const std::vector<CaptureSample>& samples, int top_k) {
  int64_t n = 0;
  for (const CaptureSample& s : samples) {
    n += 4 * static_cast<int64_t>(s.prompt.size()) +
         static_cast<int64_t>(s.output.size()) * (8 + 8 * static_cast<int64_t>(top_k)) + kLineEstimate;
  }
  return n;
}

bool TeacherCapture::submit(std::vector<CaptureSample> samples) {
  if (samples.empty()) return true;
  const int64_t bytes = size_of(samples, cfg_.top_k);
  {
    std::lock_guard lock(mu_);
    if (stop_ || queued_bytes_ + bytes > cfg_.max_queued_bytes || reserved_bytes_ + bytes > cfg_.max_bytes) {
      const bool first = dropped_ == 0;
      dropped_ += samples.size();
      if (first) {
        METRO_LOG_WARN("teacher capture: samples dropped (%s); metro_teacher_capture_dropped_total counts them",
                       reserved_bytes_ + bytes > cfg_.max_bytes ? "the dataset is at --capture-max-bytes"
                                                                : "the writer is behind");
      }
      return false;
    }
    queued_bytes_ += bytes;
    reserved_bytes_ += bytes;
    queue_.push_back(std::move(samples));
  }
  wake_.notify_one();
  return true;
}

void TeacherCapture::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

std::string TeacherCapture::encode_arrays(const CaptureSample& s, int top_k) {
  std::string out;
  out.reserve(4 * s.prompt.size() + s.output.size() * (8 + 8 * static_cast<size_t>(top_k)));
  for (int32_t t : s.prompt) put(&out, t);
  for (const engine::TokenInfo& t : s.output) put(&out, t.id);
  for (const engine::TokenInfo& t : s.output) put(&out, t.logprob);
  for (const engine::TokenInfo& t : s.output) {
    for (int j = 0; j < top_k; ++j) put(&out, j < static_cast<int>(t.top.size()) ? t.top[j].id : int32_t{-1});
  }
  for (const engine::TokenInfo& t : s.output) {
    for (int j = 0; j < top_k; ++j) {
      put(&out, j < static_cast<int>(t.top.size()) ? t.top[j].logprob : -std::numeric_limits<float>::infinity());
    }
  }
  return out;
}

void TeacherCapture::run() {
  bool failed = false;
  for (;;) {
    std::vector<CaptureSample> batch;
    int64_t bytes = 0;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        idle_.notify_all();
        return;  // stopping with nothing left
      }
      batch = std::move(queue_.front());
      queue_.pop_front();
      bytes = size_of(batch, cfg_.top_k);
      writing_ = true;
    }
    std::string lines;
    uint64_t written = 0;
    for (const CaptureSample& s : batch) {
      const std::string arrays = encode_arrays(s, cfg_.top_k);
      Json j = Json::object();
      j["id"] = s.id;
      j["request_id"] = s.request_id;
      j["model"] = s.model;
      j["variant"] = s.variant;
      j["tenant"] = s.tenant;
      j["endpoint"] = s.endpoint;
      j["created"] = s.created_unix_s;
      j["choice"] = s.choice;
      j["finish_reason"] = s.finish_reason;
      j["n_prompt"] = s.prompt.size();
      j["n_output"] = s.output.size();
      j["top_k"] = cfg_.top_k;
      j["offset"] = written_bytes_;
      j["bytes"] = arrays.size();
      if (failed) continue;
      bin_.write(arrays.data(), static_cast<std::streamsize>(arrays.size()));
      written_bytes_ += static_cast<int64_t>(arrays.size());
      lines += dump_json(j);
      lines += '\n';
      ++written;
    }
    if (!failed) {
      bin_.flush();  // the arrays before the lines that point at them
      jsonl_ << lines;
      jsonl_.flush();
      if (!bin_ || !jsonl_) {
        failed = true;
        METRO_LOG_ERROR("teacher capture: writing %s failed; capture stops", jsonl_path_.c_str());
      }
    }
    std::lock_guard lock(mu_);
    queued_bytes_ -= bytes;
    writing_ = false;
    if (failed) {
      dropped_ += batch.size();
      stop_ = true;
    } else {
      samples_ += written;
    }
    if (queue_.empty()) idle_.notify_all();
  }
}

void TeacherCapture::export_metrics(metrics::Exposition& e) const {
  std::lock_guard lock(mu_);
  e.counter("metro_teacher_capture_samples_total", "Samples written to the teacher-capture dataset (--capture-teacher).",
            "", static_cast<double>(samples_));
  e.counter("metro_teacher_capture_dropped_total",
            "Samples not captured: the writer was behind or the dataset at --capture-max-bytes.", "",
            static_cast<double>(dropped_));
  e.counter("metro_teacher_capture_bytes_total", "Bytes of arrays in the teacher-capture dataset.", "",
            static_cast<double>(written_bytes_));
}

}  // namespace metro::server
