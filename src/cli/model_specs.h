// What `metro serve -m` and `--split` name: the models a server loads and how a name's
// traffic divides between its variants.
//
//   -m FILE                 one model, named by --served-model-name / --model-name / the file
//   -m NAME=FILE            another model under its own name (repeatable)
//   -m NAME@VARIANT=FILE    a variant of NAME (a canary, say); NAME itself must be served
//   --split NAME:VARIANT=PCT   PCT percent of NAME's requests go to VARIANT (sticky per user)
//   --rollout NAME:VARIANT=P1,P2,...@DURATION   VARIANT's share steps through the percents,
//                           each step at least DURATION (30s, 10m, 1h), rolled back on a regression
//   --fault TARGET:error=SHARE,status=CODE,latency=DURATION,latency_share=SHARE
//                           faults injected into TARGET (NAME, NAME@VARIANT, or a VARIANT that
//                           only one name has) for rehearsals
//   --lora NAME=FILE        the first model with the LoRA adapter FILE, served as BASE:NAME
//                           (BASE: that model's name; repeatable): applied per request in the
//                           first model's own engine (its requests share steps with the
//                           base's and the other adapters'), or, where run-time adapters are
//                           not available (a device backend, precision tiers), merged into a
//                           copy of the model with an engine of its own
//   --lora-scaled NAME=FILE SCALE   the same at a scale
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gateway/variant_guard.h"
#include "model/lora.h"

namespace metro::cli {

struct ServeModelSpec {
  std::string name;
  std::vector<std::string> aliases;  // --served-model-name's others (the unnamed model only)
  std::string variant;               // "" for the primary
  std::string path;
  std::vector<model::LoraSpec> lora;  // adapters merged into the weights as it loads
  // Run-time adapters (ModelOptions::adapters), adapter i + 1 served as adapters[i].first.
  std::vector<std::pair<std::string, model::LoraSpec>> adapters;
};

// `names`: --served-model-name's values (the first names the unnamed model), `model_name`:
// --model-name. Errors name the value.
Expected<std::vector<ServeModelSpec>> parse_model_specs(const std::vector<std::string>& args,
                                                        const std::string& model_name,
                                                        const std::vector<std::string>& names);

// A model BASE:NAME per --lora / --lora-scaled value (scale 1 for --lora): a run-time
// adapter of the first model when `run_time`, else a spec of its own with the adapter
// merged.
Status add_lora_specs(const std::vector<std::string>& lora, const std::vector<std::pair<std::string, double>>& scaled,
                      std::vector<ServeModelSpec>& specs, bool run_time = true);

struct SplitSpec {
  std::string name, variant;
  double share = 0.0;  // 0 to 1
};
Expected<std::vector<SplitSpec>> parse_splits(const std::vector<std::string>& args,
                                              const std::vector<ServeModelSpec>& models);

Expected<std::vector<gateway::RolloutPlan>> parse_rollouts(const std::vector<std::string>& args,
                                                           const std::vector<ServeModelSpec>& models);

struct FaultTarget {
  std::string name, variant;
  gateway::FaultSpec spec;
};
Expected<std::vector<FaultTarget>> parse_faults(const std::vector<std::string>& args,
                                                const std::vector<ServeModelSpec>& models);

// The file name without its directory and `.gguf`.
std::string default_model_name(const std::string& path);

}  // namespace metro::cli
