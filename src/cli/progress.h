// A progress line for long CLI work, redrawn in place on a terminal: what is being done, a
// bar, the share done, the time left at the pace so far, and the current item. Quiet when
// stderr is not a terminal (logs and pipes get only the commands' own summaries).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "base/clock.h"

namespace metro::cli {

class Progress {
 public:
  Progress(std::string what, uint64_t total)
      : what_(std::move(what)), total_(total), tty_(isatty(STDERR_FILENO) != 0), start_ns_(now_ns()) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `n` more units done; `item` names what is being worked on.
  void advance(uint64_t n, std::string_view item = {}) {
    done_ += n;
    if (!tty_ || total_ == 0) return;
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const int bar = static_cast<int>(frac * 30);
    const double elapsed = static_cast<double>(now_ns() - start_ns_) * 1e-9;
    char eta[32] = "";
    if (frac > 0.0 && frac < 1.0 && elapsed > 0.5) {
      const double left = elapsed * (1.0 - frac) / frac;
      std::snprintf(eta, sizeof(eta), " ETA %d:%02d", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
    }
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%%-10s %-36.36s", what_.c_str(), bar, "##############################",
                 30 - bar, "", static_cast<int>(frac * 100), eta, std::string(item).c_str());
    std::fflush(stderr);
  }
  // Erases the line (on a terminal) so that other output can go where it stood; the next
  // advance() draws it again.
  void clear() {
    if (tty_ && total_ > 0) std::fprintf(stderr, "\r\033[K");
  }
  // Ends the line (on a terminal).
  void finish() {
    if (tty_ && total_ > 0) std::fprintf(stderr, "\n");
  }

 private:
  std::string what_;
  uint64_t total_, done_ = 0;
  bool tty_;
  int64_t start_ns_;
};

}  // namespace metro::cli
