// LoRA adapters merged into a model's weights at load (`metro serve --lora NAME=FILE`, the
// other commands' `--lora FILE`; ModelOptions::lora).
//
// An adapter is a GGUF file in llama.cpp's layout: general.type "adapter", adapter.type
// "lora", adapter.lora.alpha, and for each adapted matrix W of the base (GGUF dims
// [n_in, n_out]) two tensors, W's name + ".lora_a" ([n_in, r]: A, r rows of n_in) and
// + ".lora_b" ([r, n_out]: B). The adapted matrix is W + s B A with s = scale * alpha / r
// (scale alone when alpha is 0), as llama.cpp applies it at run time. metro adds the
// product to W once, in double, and stores the sum in W's own format, so an adapted model
// runs at the base model's speed; the adapter cannot be switched per request.
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

}  // namespace metro::model
