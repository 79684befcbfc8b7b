// Precision tier flags of `metro serve` (and `metro bench` where it builds engines):
//
//   --tiers high=SRC,low=SRC     SRC: `model` (the -m file itself, what an omitted tier is),
//                                a format (q8_0, q4_0, q3_k, ...) or a plan (FILE.json) that
//                                derives the tier from the -m file at start-up, or another
//                                GGUF file of the same model
//   --tier-policy auto|high|low  the controller's choice (auto) or a fixed tier
//   --tier-shadow-every N        shadow-score one of N low-tier outputs (0: off)
//   --tier-kl-max X              mean shadow KL (nats) past which the high tier comes back
//   --tier-drift-max X           a layer's mean drift past which the high tier comes back
//   --tier-cooldown S            seconds the high tier holds after a rollback
//   --tier-switches-per-min N    bound on tier switches in any minute
//   --tier-pin-realtime on|off   realtime requests always in the high tier (default on)
//   --tier-batch-budget M=X,...  the step-length factor of each load mode (the controller's
//                                batch budget)
//   --tier-admission-margin X    at high load admission refuses past X times a class's TTFT
//                                objective when below --ttft-margin (0: no change)
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "model/model.h"

namespace metro::cli {

struct TierFlags {
  std::string tiers;
  std::string policy = "auto";
  int shadow_every = 8;
  double kl_max = 0.5;
  double drift_max = 0.5;
  double cooldown_s = 60.0;
  int switches_per_min = 6;
  std::string pin_realtime = "on";
  std::string batch_budget;
  double admission_margin = 1.0;
};
void add_tier_flags(CLI::App& app, TierFlags& flags);
// The flags' syntax and values alone (to refuse bad flags before loading anything).
Status check_tier_flags(const TierFlags& flags);

struct TierModels {
  std::shared_ptr<const model::Model> high, low;
};
// The two tiers from the flags and the loaded -m model (derived tiers are requantized in
// memory on the loaded model's backend); sets the controller and the monitor in `config`.
// Without --tiers: high is `loaded`, low is null, config untouched.
Expected<TierModels> build_tiers(const TierFlags& flags, const std::shared_ptr<const model::Model>& loaded,
                                 bool allow_repack, engine::EngineConfig& config);

}  // namespace metro::cli
