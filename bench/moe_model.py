#!/usr/bin/env python3
"""A mid-sized mixture-of-experts GGUF with random weights, for speed comparisons of the
grouped expert products (docs/benchmarks.md, "Mixture of experts"). No real MoE GGUF is
reachable from here; random weights route tokens about evenly over the experts, which is
what the products cost, not what the model says.

The model: qwen3moe, 8 layers, 1024 wide, 16 query heads and 4 KV heads of 64, 64 experts
of 512 per layer, 8 per token (Qwen3-30B-A3B's shape at half its experts and a third of
its width), a vocabulary of the 256 byte tokens; F16 weights, numpy seed 7.

  /tmp/refenv/bin/python bench/moe_model.py OUT.gguf
  build/bin/metro quantize OUT.gguf OUT-q4_0.gguf --type q4_0
"""
import os
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from tiny_gguf import add_byte_vocabulary  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_VOCAB = 1024, 8, 16, 4, 64, 256
N_EXPERT, N_USED, N_FF_EXP = 64, 8, 512


def main(path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("bench moe")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF_EXP)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    add_byte_vocabulary(w)

    def mat(*shape, scale, dtype=np.float16):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    ws = 1.0 / np.sqrt(N_EMBD)
    w.add_tensor("token_embd.weight", mat(N_VOCAB, N_EMBD, scale=1.0))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    w.add_tensor("output.weight", mat(N_VOCAB, N_EMBD, scale=ws))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_HEAD * HD, N_EMBD, scale=ws))
        w.add_tensor(p + "attn_k.weight", mat(N_KV * HD, N_EMBD, scale=ws))
        w.add_tensor(p + "attn_v.weight", mat(N_KV * HD, N_EMBD, scale=ws))
        w.add_tensor(p + "attn_q_norm.weight", norm(HD))
        w.add_tensor(p + "attn_k_norm.weight", norm(HD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HD, scale=ws))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD, scale=ws, dtype=np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD, scale=ws))
        w.add_tensor(p + "ffn_up_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD, scale=ws))
        w.add_tensor(p + "ffn_down_exps.weight", mat(N_EXPERT, N_EMBD, N_FF_EXP, scale=1.0 / np.sqrt(N_FF_EXP)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
