// LoRA adapters merged into a model's weights at load (`metro serve --lora NAME=FILE`, the
// other commands' `--lora FILE`; ModelOptions::lora).
//
// An adapter is a GGUF file in llama.cpp's layout: general.type "adapter", adapter.type
// "lora", adapter.lora.alpha, and for each adapted matrix W of the base (GGUF dims
// [n_in, n_out]) two tensors, W's name + ".lora_a" ([n_in, r]: A, r rows of n_in) and
// + ".lora_b" ([r, n_out]: B). The adapted matrix is W + s B A with s = scale * alpha / r
// (scale alone when alpha is 0), as llama.cpp applies it at run time. Two ways to apply it:
//  - merge_lora adds the product to W once, in double, and stores the sum in W's own
//    format: the adapted model runs at the base model's speed (ModelOptions::lora);
//  - read_lora keeps the factors, and a model loaded with them (ModelOptions::adapters)
//    adds each token's adapter's s B (A x) to its products at run time, so requests with
//    different adapters share one batched step (backends::LoraOp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace metro::model {

struct LoraSpec {
  std::string path;
  float scale = 1.0f;
};

// One adapter's factors for one base matrix, F32: A [rank][n_in], B [n_out][rank].
struct LoraDelta {
  std::vector<float> a;
  std::vector<float> b;
  int64_t rank = 0;
  float s = 1.0f;  // scale * alpha / rank (scale alone when alpha is 0)
};

struct LoraReport {
  size_t matrices = 0;  // base matrices adapted (by any adapter)
  size_t adapters = 0;
};

// The bytes of `base` with every adapter's products added to the matrices it names.
// Refused: a file that is not a LoRA adapter, an adapter for another architecture, a pair
// missing its other half, a matrix the base does not have or whose shape does not fit, a
// rank of 0 or above 65536, a non-finite scale.
Expected<std::vector<uint8_t>> merge_lora(const gguf::File& base, std::span<const LoraSpec> adapters,
                                          LoraReport* report = nullptr);

// The same with adapters already parsed: adapters[i] at specs[i].scale, named by
// specs[i].path in errors (the fuzz target feeds bytes here).
Expected<std::vector<uint8_t>> merge_lora(const gguf::File& base, std::span<const gguf::File* const> adapters,
                                          std::span<const LoraSpec> specs, LoraReport* report = nullptr);

// The adapter's factors by base matrix name, checked against `base` as merge_lora checks
// them; `spec.path` names the adapter in errors.
Expected<std::vector<std::pair<std::string, LoraDelta>>> read_lora(const gguf::File& base, const gguf::File& adapter,
                                                                   const LoraSpec& spec);

}  // namespace metro::model
