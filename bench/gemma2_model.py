#!/usr/bin/env python3
"""A gemma2 GGUF of gemma-2-2b's shape with random weights, for speed comparisons: no real
gemma2 file is reachable from here (docs/benchmarks.md, "Gemma 2").

The model: gemma2, 26 layers, 2304 wide, 8 query heads and 4 KV heads of 256, FFN 9216, a
window of 4096 on every other layer, attention and logit soft-caps 50 and 30 (gemma2's), a
tied head; F16 weights, numpy seed 3; a vocabulary of 32000 (the 256 byte tokens, then
placeholders; the real one has 256000, which makes the head 8x larger).

  /tmp/refenv/bin/python bench/gemma2_model.py OUT-f16.gguf
  build/bin/metro quantize OUT-f16.gguf OUT-q4_0.gguf --type q4_0
"""
import os
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from tiny_gguf import add_byte_vocabulary  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_FF, N_VOCAB = 2304, 26, 8, 4, 256, 9216, 32000


def main(path):
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(path, "gemma2")
    w.add_name("bench gemma2")
    w.add_context_length(8192)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(4096)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    add_byte_vocabulary(w, N_VOCAB)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(N_VOCAB, N_EMBD))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_HEAD * HD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_KV * HD, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_KV * HD, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HD))
        w.add_tensor(p + "post_attention_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))
        w.add_tensor(p + "post_ffw_norm.weight", norm(N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
