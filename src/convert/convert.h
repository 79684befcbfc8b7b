// Hugging Face checkpoint -> GGUF: `metro convert HF_DIR OUT.gguf [--type T]`. Reads
// config.json, the safetensors weights (sharded or not) and the tokenizer files, and writes
// the GGUF llama.cpp's converter would write for the same model (its tensor names and
// metadata keys), so that both metro and llama.cpp load it.
//
// Architectures: BERT-family encoders (config model_type "bert": BertModel and the
// sentence-transformers models built on it, with the pooling of 1_Pooling/config.json;
// "nomic_bert": nomic-embed-text's rotary, fused-QKV, SiLU-gated layout);
// decoders of model_type llama and mistral (GGUF llama, Q and K rows reordered for
// llama.cpp's pairwise rotation, a mistral's sliding window kept), qwen2 (biases on Q, K,
// V), qwen3 (per-head Q and K norms, a head width of its own), the mixtures of experts
// qwen3_moe, qwen2_moe (with its gated shared expert) and mixtral (experts stacked per layer
// into 3-D tensors) and gemma3 (gemma3_text, or
// the multimodal gemma3's language model: norms shifted to 1 + w, the layer pattern and the
// local RoPE base), gemma (norms as 1 + w, no post norms), gemma2 (the same norms, every other layer windowed, its attention and
// logit soft-caps), phi3 (fused QKV and gate/up, partial rotation, LongRoPE), granite (llama's layer with its
// embedding, attention, residual and logit factors) and olmo2 (post norms only, Q and K normed whole), with RoPE scaling linear, yarn or llama3 (as rope_freqs.weight) and a
// byte-level BPE or SentencePiece BPE tokenizer (convert/hf_tokenizer.h). Others are
// refused by name.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/dtype.h"

namespace metro::convert {

struct ConvertOptions {
  // Format of the weight matrices: F32, F16, BF16, or any block format `metro quantize`
  // writes (a K-quant falls back to a 32-block format where rows do not divide into 256).
  // Norms, biases, position and token-type embeddings stay F32.
  kernels::DType type = kernels::DType::kF16;
  // A llama.cpp mix ("q4_k_m", "q5_k_m": model::preset_plan) overriding `type` per matrix;
  // empty for none.
  std::string preset;
  // Called as tensors are converted: bytes of the checkpoint done, of all of it, the tensor.
  std::function<void(uint64_t done, uint64_t total, std::string_view name)> on_tensor;
};

struct ConvertReport {
  std::string architecture;  // GGUF general.architecture written
  int n_tensors = 0;
  int n_vocab = 0;
  uint64_t bytes = 0;        // of the GGUF
  uint64_t source_bytes = 0; // of the checkpoint's tensors
  // Tokenizer settings the GGUF does not carry, one line each.
  std::vector<std::string> warnings;
};

// The GGUF bytes of the model in `hf_dir`, in memory.
Expected<std::vector<uint8_t>> convert_hf(const std::string& hf_dir, const ConvertOptions& opts,
                                          ConvertReport* report = nullptr);

// The same file streamed to `out_path` one tensor at a time (memory: the checkpoint mapped,
// plus about the largest tensor in F32), written beside it and renamed into place.
Status convert_hf_to_file(const std::string& hf_dir, const std::string& out_path, const ConvertOptions& opts,
                          ConvertReport* report = nullptr);

}  // namespace metro::convert
