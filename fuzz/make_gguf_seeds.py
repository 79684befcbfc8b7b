#!/usr/bin/env python3
"""Writes the committed seed corpus for fuzz/gguf_fuzz.cpp: small GGUF files that reach
every branch of the reader (all value types, nested arrays, tensors, alignment, a tiny
llama header). Run: python3 fuzz/make_gguf_seeds.py fuzz/corpus/gguf"""
import struct, sys, os

def s(x: str) -> bytes:
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

def kv(key, t, payload):
    return s(key) + struct.pack('<I', t) + payload

def header(n_t, n_kv, version=3):
    return b'GGUF' + struct.pack('<IQQ', version, n_t, n_kv)

def pad(b, a=32):
    return b + b'\0' * ((-len(b)) % a)

def tensor(name, dims, typ, off):
    return s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', typ, off)

def write(dirname, name, data):
    with open(os.path.join(dirname, name), 'wb') as f:
        f.write(data)

def main(out):
    os.makedirs(out, exist_ok=True)
    kvs = [
        kv('a.u8', 0, struct.pack('<B', 7)), kv('a.i8', 1, struct.pack('<b', -7)),
        kv('a.u16', 2, struct.pack('<H', 7)), kv('a.i16', 3, struct.pack('<h', -7)),
        kv('a.u32', 4, struct.pack('<I', 7)), kv('a.i32', 5, struct.pack('<i', -7)),
        kv('a.f32', 6, struct.pack('<f', 0.5)), kv('a.bool', 7, b'\x01'),
        kv('a.str', 8, s('hello')), kv('a.u64', 10, struct.pack('<Q', 7)),
        kv('a.i64', 11, struct.pack('<q', -7)), kv('a.f64', 12, struct.pack('<d', 0.25)),
        kv('a.arr', 9, struct.pack('<IQ', 8, 2) + s('x') + s('yz')),
        kv('a.nested', 9, struct.pack('<IQ', 9, 1) + struct.pack('<IQ', 4, 2) + struct.pack('<II', 1, 2)),
    ]
    body = header(0, len(kvs)) + b''.join(kvs)
    write(out, 'all_types.gguf', body)

    meta = [
        kv('general.architecture', 8, s('llama')),
        kv('general.alignment', 4, struct.pack('<I', 32)),
        kv('llama.embedding_length', 4, struct.pack('<I', 32)),
        kv('llama.block_count', 4, struct.pack('<I', 1)),
        kv('llama.attention.head_count', 4, struct.pack('<I', 4)),
        kv('llama.attention.head_count_kv', 4, struct.pack('<I', 2)),
        kv('llama.feed_forward_length', 4, struct.pack('<I', 64)),
        kv('tokenizer.ggml.tokens', 9, struct.pack('<IQ', 8, 3) + s('a') + s('b') + s('c')),
    ]
    tinfo = tensor('blk.0.attn_norm.weight', [32], 0, 0) + tensor('token_embd.weight', [32, 3], 8, 128)
    data = pad(b'\x01' * 128) + b'\x02' * (3 * 34)
    f = pad(header(2, len(meta)) + b''.join(meta) + tinfo) + data
    write(out, 'tiny_llama.gguf', f)
    write(out, 'truncated.gguf', f[: len(f) // 2])

    # A mixture-of-experts header: the expert keys and the shared expert's tensor names
    # that HParams::from_gguf reads (qwen2moe, 4 experts, 2 per token).
    moe = [
        kv('general.architecture', 8, s('qwen2moe')),
        kv('qwen2moe.embedding_length', 4, struct.pack('<I', 32)),
        kv('qwen2moe.block_count', 4, struct.pack('<I', 1)),
        kv('qwen2moe.attention.head_count', 4, struct.pack('<I', 4)),
        kv('qwen2moe.feed_forward_length', 4, struct.pack('<I', 64)),
        kv('qwen2moe.expert_count', 4, struct.pack('<I', 4)),
        kv('qwen2moe.expert_used_count', 4, struct.pack('<I', 2)),
        kv('qwen2moe.expert_feed_forward_length', 4, struct.pack('<I', 16)),
        kv('qwen2moe.expert_shared_feed_forward_length', 4, struct.pack('<I', 32)),
        kv('qwen2moe.expert_gating_func', 4, struct.pack('<I', 1)),
        kv('qwen2moe.expert_weights_norm', 7, b'\x00'),
        kv('tokenizer.ggml.tokens', 9, struct.pack('<IQ', 8, 3) + s('a') + s('b') + s('c')),
    ]
    minfo = (tensor('blk.0.attn_norm.weight', [32], 0, 0) + tensor('blk.0.ffn_gate_shexp.weight', [32, 32], 0, 128) +
             tensor('blk.0.ffn_gate_inp_shexp.weight', [32], 0, 4224))
    mdata = pad(b'\x01' * 128) + b'\x02' * 4096 + b'\x03' * 128
    write(out, 'tiny_qwen2moe.gguf', pad(header(3, len(moe)) + b''.join(moe) + minfo) + mdata)
    write(out, 'v2_empty.gguf', header(0, 0, 2))

if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'fuzz/corpus/gguf')
