#!/usr/bin/env python3
"""Writes a GGUF model cut to its first N layers: the same metadata (block_count set to N),
embedding, output norm and head, and layers 0..N-1, byte for byte.

    scripts/gguf_truncate.py IN.gguf OUT.gguf N

What it is for: a model small enough to carry to a GPU machine whose transfer limit the
whole model exceeds (scripts/gpu_bundle.sh). A cut model is not a useful language model, but
every op, shape and weight format of the full one runs, so backends can be compared on it.
Reads GGUF v2/v3 (little endian) as the GGUF specification lays it out.
"""
import re
import struct
import sys

# ggml type id -> (elements per block, bytes per block), for the types metro reads.
TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
              8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
              13: (256, 176), 14: (256, 210), 15: (256, 292), 30: (1, 2)}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, n):
        b = self.d[self.p:self.p + n]
        if len(b) != n:
            raise ValueError("truncated GGUF file")
        self.p += n
        return b

    def u(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.u("<Q")).decode("utf-8")

    def skip_value(self, t):
        if t in SCALAR:
            self.take(struct.calcsize(SCALAR[t]))
        elif t == 8:
            self.take(self.u("<Q"))
        elif t == 9:
            et, n = self.u("<I"), self.u("<Q")
            if et in SCALAR:
                self.take(struct.calcsize(SCALAR[et]) * n)
            else:
                for _ in range(n):
                    self.skip_value(et)
        else:
            raise ValueError(f"unknown GGUF value type {t}")


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, n_keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(src, "rb") as f:
        data = f.read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        sys.exit("not a GGUF file")
    version = r.u("<I")
    n_tensors, n_kv = r.u("<Q"), r.u("<Q")
    kv_out = []
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        t = r.u("<I")
        start = r.p
        if key.endswith(".block_count"):
            old = r.u(SCALAR[t])
            if n_keep < 1 or n_keep > old:
                sys.exit(f"the model has {old} layers; keep 1..{old}")
            kv_out.append(pack_string(key) + struct.pack("<I", t) + struct.pack(SCALAR[t], n_keep))
            continue
        if key == "general.alignment":
            alignment = r.u(SCALAR[t])
            r.p = start
        r.skip_value(t)
        kv_out.append(pack_string(key) + struct.pack("<I", t) + data[start:r.p])
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u("<I")
        dims = [r.u("<Q") for _ in range(n_dims)]
        t, off = r.u("<I"), r.u("<Q")
        tensors.append((name, dims, t, off))
    data_start = (r.p + alignment - 1) // alignment * alignment

    keep = []
    for name, dims, t, off in tensors:
        m = re.match(r"blk\.(\d+)\.", name)
        if m and int(m.group(1)) >= n_keep:
            continue
        if t not in TYPE_SIZES:
            sys.exit(f"{name}: ggml type {t} not known to this script")
        elems = 1
        for d in dims:
            elems *= d
        block, size = TYPE_SIZES[t]
        keep.append((name, dims, t, data[data_start + off:data_start + off + elems // block * size]))

    header = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(keep), len(kv_out)))
    for kv in kv_out:
        header += kv
    body = bytearray()
    for name, dims, t, blob in keep:
        pad = (-len(body)) % alignment
        body += b"\0" * pad
        header += pack_string(name) + struct.pack("<I", len(dims))
        header += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, len(body))
        body += blob
    header += b"\0" * ((-len(header)) % alignment)
    with open(dst, "wb") as f:
        f.write(header)
        f.write(body)
    print(f"{dst}: {n_keep} layers, {len(keep)} of {n_tensors} tensors, {len(header) + len(body)} bytes")


if __name__ == "__main__":
    main()
