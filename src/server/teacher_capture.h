// Teacher capture (`metro serve --capture-teacher DIR`): a dataset for distilling a student
// from the served model, written from the answers it gives.
//
// For a sampled share of requests (opt-in per tenant; see CaptureConfig), each prompt and
// each of its choices becomes one sample: the prompt's token ids, the output's token ids,
// and at every output position the log-probability of the chosen token and of the model's
// `top_k` most likely tokens, all from the model's raw distribution (before temperature,
// penalties, biases or grammars), the targets a distillation loss (KL to the teacher) needs.
//
// Two files per server process, appended together: `teacher-<UTC time>-<pid>.jsonl`, one
// JSON object per sample, and `teacher-<UTC time>-<pid>.bin`, the arrays, which the object
// locates by `offset` (bytes into the .bin) and `bytes`. At `offset`, little-endian:
//
//   int32   prompt[n_prompt]
//   int32   output[n_output]
//   float32 output_logprob[n_output]
//   int32   top_ids[n_output][top_k]        best first; -1 past the vocabulary's end
//   float32 top_logprobs[n_output][top_k]   -inf where the id is -1
//
// The object also holds: `id` (the response id), `request_id` (x-request-id), `model`,
// `variant` ("" for the primary), `tenant`, `endpoint`, `created` (Unix seconds), `choice`,
// `finish_reason`, `n_prompt`, `n_output`, `top_k`. A line is written only after its arrays,
// so a reader never sees a line whose arrays are not there. tools/teacher_capture.py reads it.
//
// Samples go to a writer thread through a queue bounded in bytes: a full queue or a dataset
// at its size limit drops samples (counted), never slows a request.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/metrics.h"
#include "base/status.h"
#include "engine/request.h"

namespace metro::server {

struct CaptureConfig {
  std::string dir;
  int top_k = 8;                    // alternatives per output position, 1 to 20
  double rate = 1.0;                // share of requests captured when no tenant has a share of its own
  // Shares by tenant (an API-key file's `capture=R`). Non-empty: capture is opt-in, only these
  // tenants' requests are captured, each at its share.
  std::map<std::string, double> tenant_rates;
  int64_t max_bytes = int64_t{1} << 30;      // the dataset's size; samples past it are dropped
  int64_t max_queued_bytes = int64_t{64} << 20;  // waiting for the writer
};

// One prompt and one of its choices.
struct CaptureSample {
  std::string id, request_id, model, variant, tenant, endpoint, finish_reason;
  int64_t created_unix_s = 0;
  int choice = 0;
  std::vector<int32_t> prompt;
  std::vector<engine::TokenInfo> output;  // each with at least top_k alternatives requested
};

class TeacherCapture {
 public:
  // Creates `cfg.dir` when missing and opens the two files. Errors: a bad top_k or share, a
  // directory or file that cannot be made.
  static Expected<std::unique_ptr<TeacherCapture>> open(CaptureConfig cfg);
  ~TeacherCapture();  // writes what is queued, then closes
  TeacherCapture(const TeacherCapture&) = delete;
  TeacherCapture& operator=(const TeacherCapture&) = delete;

  // Whether to capture a request of `tenant` ("" without API keys): a draw at its share.
  bool sample(const std::string& tenant);
  int top_k() const { return cfg_.top_k; }
  // Queues one request's samples (false: dropped, queue full or dataset at its limit). Any
  // thread.
  bool submit(std::vector<CaptureSample> samples);
  // Waits until every queued sample is written and flushed.
  void flush();
  const std::string& jsonl_path() const { return jsonl_path_; }
  const std::string& bin_path() const { return bin_path_; }
  // metro_teacher_capture_samples_total, _dropped_total, _bytes_total.
  void export_metrics(metrics::Exposition& e) const;

  // The .bin bytes of one sample (the layout above), top_k columns.
  static std::string encode_arrays(const CaptureSample& s, int top_k);

 private:
  explicit TeacherCapture(CaptureConfig cfg);
  void run();
  static int64_t size_of(const std::vector<CaptureSample>& samples, int top_k);

  CaptureConfig cfg_;
  std::string jsonl_path_, bin_path_;
  std::ofstream jsonl_, bin_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::vector<CaptureSample>> queue_;
  int64_t queued_bytes_ = 0;
  int64_t reserved_bytes_ = 0;  // queued or written: what max_bytes bounds
  int64_t written_bytes_ = 0;   // .bin bytes written
  uint64_t samples_ = 0, dropped_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::thread writer_;
};

}  // namespace metro::server
