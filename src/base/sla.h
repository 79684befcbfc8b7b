// The request vocabulary every layer may include: the SLA class a request runs in, the
// service-level objectives of each class, and the `--sla` option that sets them.
//
// Grammar (docs/scheduling.md has the long form):
//
//   spec    := clause { sep clause }          sep := one or more of ' ' '\t' ';'
//   clause  := class ':' setting { ',' setting }
//   class   := realtime | standard | batch
//   setting := ttft=SECONDS | tpot=SECONDS | starve=SECONDS | quantum=TOKENS
//   SECONDS := a decimal number with an optional unit, 's' (default) or 'ms'; finite,
//              > 0 and <= 86400 s
//   TOKENS  := a whole number in [1, 1000000]
//
//   e.g.  realtime:ttft=0.5,tpot=0.1 standard:ttft=2,tpot=0.2 batch:ttft=30
//
// A class or a key may appear once; what is not named keeps its default. `starve` not given
// follows the class's TTFT (4 x ttft), so raising a class's TTFT also relaxes its bound.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace metro {

// Latency classes, best first. A request's class is chosen by its API key (a ceiling) and
// its headers; every layer from the server down to the scheduler speaks of it.
enum class SlaClass : uint8_t { kRealtime = 0, kStandard = 1, kBatch = 2 };
inline constexpr int kNumSlaClasses = 3;

const char* sla_class_name(SlaClass c);
// "realtime" | "standard" | "batch"; false for anything else.
bool parse_sla_class(const std::string& s, SlaClass* out);

struct SlaClassConfig {
  double ttft_s = 2.0;   // time to first token objective
  double tpot_s = 0.2;   // time per output token objective (mean over the request)
  // Starvation bound: a request of this class that has waited (or, running, been paused)
  // this long is served ahead of everything younger (see SlaScheduler).
  double starve_s = 8.0;
  bool starve_explicit = false;  // set by `starve=`; otherwise starve_s = 4 * ttft_s
  // Skip-join MLFQ quantum in work tokens (an output token is 1, a prompt token
  // SlaSchedulerConfig::prefill_token_cost): level k of the class ends after
  // quantum * (2^(k+1) - 1) work tokens.
  int quantum_tokens = 1024;
};

struct SlaConfig {
  std::array<SlaClassConfig, kNumSlaClasses> classes = default_classes();

  const SlaClassConfig& of(SlaClass c) const { return classes[static_cast<size_t>(c)]; }
  SlaClassConfig& of(SlaClass c) { return classes[static_cast<size_t>(c)]; }

  // realtime ttft 0.5 tpot 0.1 quantum 256; standard ttft 2 tpot 0.2 quantum 1024; batch
  // ttft 30 tpot 1 quantum 4096; starve = 4 x ttft (2 s, 8 s, 120 s).
  static std::array<SlaClassConfig, kNumSlaClasses> default_classes();
};

inline constexpr double kStarvePerTtft = 4.0;
inline constexpr double kMaxSloSeconds = 86400.0;
inline constexpr int kMaxQuantumTokens = 1000000;

// Parses an `--sla` spec over the defaults. Errors name the offending token.
Expected<SlaConfig> parse_sla_spec(std::string_view spec);
// The same over an already configured base (e.g. a config file's values).
Expected<SlaConfig> parse_sla_spec(std::string_view spec, const SlaConfig& base);

// The canonical spec of a config (every class, every key); parse_sla_spec() reads it back.
std::string format_sla_spec(const SlaConfig& cfg);

}  // namespace metro
