#!/usr/bin/env python3
"""A dense llama GGUF of TinyLlama-1.1B's shape with random weights, for speed comparisons of
formats whose rows must divide into 256-blocks (the K-quants: docs/benchmarks.md, "K-quant
kernels"). The default model's 576-wide rows do not, and no 1B-class GGUF in a K-quant is
reachable from here.

The model: llama, 22 layers, 2048 wide, 32 query heads and 4 KV heads of 64, FFN 5632, a
vocabulary of 32000 (the 256 byte tokens, then placeholders), untied head; F16 weights,
numpy seed 11. Q4_K_M's mix comes from `metro quantize --plan` (bench/q4_k_m_plan.json:
Q6_K for the head, attn_v and ffn_down, Q4_K elsewhere).

  /tmp/refenv/bin/python bench/dense_model.py OUT.gguf
  build/bin/metro quantize OUT.gguf OUT-q4_k.gguf --type q4_k
  build/bin/metro quantize OUT.gguf OUT-q4_k_m.gguf --type q4_k --plan bench/q4_k_m_plan.json
"""
import os
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from tiny_gguf import add_byte_vocabulary  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_FF, N_VOCAB = 2048, 22, 32, 4, 64, 5632, 32000


def main(path):
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bench dense")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_rope_dimension_count(HD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    add_byte_vocabulary(w, N_VOCAB)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(N_VOCAB, N_EMBD))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    w.add_tensor("output.weight", mat(N_VOCAB, N_EMBD))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_HEAD * HD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_KV * HD, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_KV * HD, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HD))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
