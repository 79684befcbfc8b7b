#!/usr/bin/env python3
"""Reads the dataset `metro serve --capture-teacher DIR` writes (layout: docs/server.md,
"Teacher capture"), with nothing beyond the standard library.

As a module:

    import teacher_capture
    for s in teacher_capture.samples("DIR"):
        s["prompt"], s["output"]          # token ids
        s["output_logprob"]               # per output position, the chosen token's
        s["top_ids"], s["top_logprobs"]   # per output position, top_k of each (best first)

As a command, a summary (or every sample as JSON with --dump):

    python3 scripts/teacher_capture.py DIR [--dump]
"""
import argparse
import glob
import json
import math
import os
import struct
import sys


def _pairs(path):
    """(jsonl, bin) pairs under a directory, or the pair of one .jsonl file."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "teacher-*.jsonl")))
    else:
        files = [path]
    return [(f, f[: -len(".jsonl")] + ".bin") for f in files]


def _read(buf, offset, fmt, n):
    size = struct.calcsize("<%d%s" % (n, fmt))
    return list(struct.unpack_from("<%d%s" % (n, fmt), buf, offset)), offset + size


def samples(path):
    """Every sample under `path` (a directory or a .jsonl file), in the order written."""
    for jsonl, binfile in _pairs(path):
        with open(binfile, "rb") as f:
            data = f.read()
        with open(jsonl) as f:
            for line in f:
                if not line.strip():
                    continue
                meta = json.loads(line)
                n_p, n_o, k = meta["n_prompt"], meta["n_output"], meta["top_k"]
                off = meta["offset"]
                want = 4 * (n_p + 2 * n_o + 2 * n_o * k)
                if meta["bytes"] != want or off + want > len(data):
                    raise ValueError(f"{jsonl}: sample {meta['id']} choice {meta['choice']}: arrays do not fit")
                s = dict(meta)
                s["prompt"], off = _read(data, off, "i", n_p)
                s["output"], off = _read(data, off, "i", n_o)
                s["output_logprob"], off = _read(data, off, "f", n_o)
                ids, off = _read(data, off, "i", n_o * k)
                lps, off = _read(data, off, "f", n_o * k)
                s["top_ids"] = [ids[i * k:(i + 1) * k] for i in range(n_o)]
                s["top_logprobs"] = [lps[i * k:(i + 1) * k] for i in range(n_o)]
                yield s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="the --capture-teacher directory, or one teacher-*.jsonl file")
    ap.add_argument("--dump", action="store_true", help="print every sample as one JSON line")
    args = ap.parse_args()
    n = tokens = 0
    nll = 0.0
    models = {}
    for s in samples(args.path):
        if args.dump:
            print(json.dumps(s))
            continue
        n += 1
        tokens += s["n_output"]
        nll -= sum(lp for lp in s["output_logprob"] if math.isfinite(lp))
        key = s["model"] + ("@" + s["variant"] if s["variant"] else "")
        models[key] = models.get(key, 0) + 1
    if not args.dump:
        print(f"{n} samples, {tokens} output tokens, mean NLL {nll / max(1, tokens):.3f} nats/token; by model: {models}")


if __name__ == "__main__":
    sys.exit(main())
