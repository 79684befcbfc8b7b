#!/usr/bin/env python3
"""Writes the committed seed corpus for fuzz/kv_events_fuzz.cpp: EventBatch payloads in the
map and array layouts `metro serve --kv-events` publishes (stores chained on a parent,
removals, a clear). Run: python3 fuzz/make_kv_events_seeds.py fuzz/corpus/kv_events"""
import os
import struct
import sys


def pack(v):
    if v is None:
        return b"\xc0"
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 0x80:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, list):
        return (bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))) + b"".join(map(pack, v))
    if isinstance(v, dict):
        out = bytes([0x80 | len(v)])
        for k, x in v.items():
            out += pack(k) + pack(x)
        return out
    raise TypeError(v)


def stored_map(hashes, parent, tokens, bs):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": bs, "lora_id": None, "medium": "CPU", "lora_name": None}


def main(out):
    os.makedirs(out, exist_ok=True)
    bs = 4
    a = list(range(10, 18))
    b = list(range(18, 22))
    seeds = {
        "map_chain": {"ts": 1.5, "events": [stored_map([1 << 40, 7], None, a, bs), stored_map([9], 7, b, bs),
                                            {"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU"}],
                      "data_parallel_rank": 0},
        "array_chain": [2.0, [["BlockStored", [3, 4], None, a, bs, None, "CPU"], ["BlockRemoved", [3], "CPU"],
                              ["AllBlocksCleared"]], 0],
        "map_bad_fields": {"ts": 0.0, "events": [stored_map([5], 1234, b, bs), stored_map([6], None, [1, 2], bs),
                                                 {"type": "Other"}], "data_parallel_rank": 0},
    }
    for name, v in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(pack(v))


if __name__ == "__main__":
    main(sys.argv[1])
