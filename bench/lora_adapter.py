#!/usr/bin/env python3
"""A random LoRA adapter for the default model (SmolLM2-135M, llama layout, 30 layers, 576
wide, FFN 1536), in llama.cpp's adapter layout: rank R on the attention and FFN matrices
of every layer (q, k, v, o, gate, up, down), alpha = R. For speed comparisons of run-time
adapters (docs/benchmarks.md, "LoRA adapters"); its outputs mean nothing.

  /tmp/refenv/bin/python bench/lora_adapter.py OUT.gguf [RANK] [SEED]
"""
import sys

import gguf
import numpy as np

N_EMBD, N_FF, N_KV, N_LAYER = 576, 1536, 192, 30


def main(path, rank=16, seed=1):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    shapes = {"attn_q": (N_EMBD, N_EMBD), "attn_k": (N_EMBD, N_KV), "attn_v": (N_EMBD, N_KV),
              "attn_output": (N_EMBD, N_EMBD), "ffn_gate": (N_EMBD, N_FF), "ffn_up": (N_EMBD, N_FF),
              "ffn_down": (N_FF, N_EMBD)}
    for il in range(N_LAYER):
        for name, (n_in, n_out) in shapes.items():
            t = f"blk.{il}.{name}.weight"
            w.add_tensor(t + ".lora_a", (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32))
            w.add_tensor(t + ".lora_b", (rng.standard_normal((n_out, rank)) * 0.01).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16, int(sys.argv[3]) if len(sys.argv) > 3 else 1)
