// `metro serve --step-trace FILE`: one line per engine step with the step cost model's
// inputs and the step's time (bench/step_cost_fit.py fits them), as a StepObserver.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/step_observer.h"

namespace metro::engine {

class StepTraceWriter final : public StepObserver {
 public:
  // Errors: the file cannot be written (the message names the flag, not the path).
  static Expected<std::shared_ptr<StepTraceWriter>> open(const std::string& path);
  void on_step(const StepReport& r) override;
  bool wants_op_times() const override { return true; }

 private:
  explicit StepTraceWriter(std::FILE* f) : file_(f, &std::fclose) {}
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  uint64_t lines_ = 0;
};

}  // namespace metro::engine
