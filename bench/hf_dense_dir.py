#!/usr/bin/env python3
"""A Hugging Face directory of a dense llama in TinyLlama-1.1B's shape with random F16 weights
in two safetensors shards, for timing `metro convert` and its memory (docs/benchmarks.md,
"Converting a checkpoint"). The tokenizer is the tiny byte-level BPE of
tests/fixtures/hf_checkpoints/llama_tiny, so the embedding has its 423 rows; everything else
has the 1.1B model's sizes.

  /tmp/refenv/bin/python bench/hf_dense_dir.py OUT_DIR
  /usr/bin/time -v build/bin/metro convert OUT_DIR /tmp/dense.gguf --type q4_k_m
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

N_EMBD, N_LAYER, N_HEAD, N_KV, N_FF = 2048, 22, 32, 4, 5632
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "tests", "fixtures", "hf_checkpoints", "llama_tiny")


def main(out):
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), out)
    with open(os.path.join(TOKENIZER, "config.json")) as f:
        n_vocab = json.load(f)["vocab_size"]
    rng = np.random.default_rng(3)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def norm():
        return np.ones(N_EMBD, dtype=np.float16)

    hd = N_EMBD // N_HEAD
    shards = [{}, {}]
    shards[0]["model.embed_tokens.weight"] = mat(n_vocab, N_EMBD)
    shards[1]["lm_head.weight"] = mat(n_vocab, N_EMBD)
    shards[1]["model.norm.weight"] = norm()
    for il in range(N_LAYER):
        s = shards[0 if il < N_LAYER // 2 else 1]
        p = f"model.layers.{il}."
        s[p + "input_layernorm.weight"] = norm()
        s[p + "post_attention_layernorm.weight"] = norm()
        s[p + "self_attn.q_proj.weight"] = mat(N_HEAD * hd, N_EMBD)
        s[p + "self_attn.k_proj.weight"] = mat(N_KV * hd, N_EMBD)
        s[p + "self_attn.v_proj.weight"] = mat(N_KV * hd, N_EMBD)
        s[p + "self_attn.o_proj.weight"] = mat(N_EMBD, N_HEAD * hd)
        s[p + "mlp.gate_proj.weight"] = mat(N_FF, N_EMBD)
        s[p + "mlp.up_proj.weight"] = mat(N_FF, N_EMBD)
        s[p + "mlp.down_proj.weight"] = mat(N_EMBD, N_FF)
    index = {"metadata": {}, "weight_map": {}}
    for i, s in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file(s, os.path.join(out, fn))
        index["weight_map"].update({k: fn for k in s})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": N_EMBD,
              "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV,
              "intermediate_size": N_FF, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "vocab_size": n_vocab, "tie_word_embeddings": False, "hidden_act": "silu",
              "torch_dtype": "float16"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
