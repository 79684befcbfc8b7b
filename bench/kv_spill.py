#!/usr/bin/env python3
"""The KV spill tier (`--kv-spill-dir`) against plain eviction, on `metro serve`.

Two workloads, each on a server with the tier off and on, same model, same flags:

  reuse     multi-turn: N conversations with a long shared history each, taken in turn, so
            the working set is N times what the KV budget holds; every turn after the first
            finds its history evicted from memory. TTFT of the returning turns and the prompt
            tokens the server computed (metro_prompt_tokens_total).
  no-reuse  every prompt new: what keeping evicted blocks costs when nothing comes back.

    python3 bench/kv_spill.py --metro build/bin/metro --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_util import MetroServer, metrics, request  # noqa: E402


WORDS = ("the river runs past old stone walls where people walk slowly in the morning light and talk about "
         "bread music weather trains books gardens markets rain summer winter friends letters roads hills").split()


def history(i, n_words):
    """A history of about n_words tokens (one token a word), its own for each i."""
    return f"Conversation {i}: " + " ".join(WORDS[(k * 7 + i * 13) % len(WORDS)] for k in range(n_words))


def ttft(port, prompt):
    t0 = time.perf_counter()
    st, _, data = request(port, "POST", "/v1/completions",
                          {"prompt": prompt, "max_tokens": 1, "temperature": 0}, timeout=600)
    assert st == 200, data[:300]
    return time.perf_counter() - t0


def run(args, spill, workload):
    extra = ["--ctx", str(args.ctx), "--ctx-total", str(args.ctx_total), "-t", str(args.threads),
             "--admission", "off"]
    tmp = tempfile.mkdtemp(prefix="metro-spill-bench-")
    if spill:
        extra += ["--kv-spill-dir", tmp, "--kv-spill-bytes", args.spill_bytes]
    srv = MetroServer(args.metro, args.model, extra).start()
    try:
        srv.wait_ready()
        ttft(srv.port, "warm up")
        before = metrics(srv.port)["metro_prompt_tokens_total"]
        times = []
        if workload == "reuse":
            hist = [history(i, args.words) for i in range(args.conversations)]
            for i in range(args.conversations):  # first turns: every history computed once
                ttft(srv.port, hist[i] + " Turn 0.")
            mid = metrics(srv.port)["metro_prompt_tokens_total"]
            for turn in range(1, args.turns + 1):
                for i in range(args.conversations):
                    times.append(ttft(srv.port, hist[i] + f" Turn 0. Turn {turn}."))
            after = metrics(srv.port)
            computed = after["metro_prompt_tokens_total"] - mid
        else:
            for i in range(args.conversations * args.turns):
                times.append(ttft(srv.port, history(1000 + i, args.words) + " Once."))
            after = metrics(srv.port)
            computed = after["metro_prompt_tokens_total"] - before
        restored = after.get("metro_prefix_cache_restored_tokens_total", 0.0)
        times.sort()
        return {"spill": spill, "workload": workload, "requests": len(times),
                "ttft_p50_s": statistics.median(times), "ttft_p99_s": times[min(len(times) - 1, int(0.99 * len(times)))],
                "prompt_tokens_computed": computed, "restored_tokens": restored}
    finally:
        srv.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metro", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--ctx-total", type=int, default=4096, help="the RAM KV budget in tokens")
    ap.add_argument("--words", type=int, default=3900, help="history length in tokens (one token a word)")
    ap.add_argument("--conversations", type=int, default=4, help="histories taken in turn: the working set")
    ap.add_argument("--turns", type=int, default=1, help="returning turns per conversation")
    ap.add_argument("--spill-bytes", default="2GiB")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run(args, spill, w) for w in ("reuse", "no-reuse") for spill in (False, True)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'workload':9} {'spill':5} {'requests':>8} {'TTFT p50 s':>11} {'TTFT p99 s':>11} "
          f"{'computed tokens':>16} {'restored':>9}")
    for r in rows:
        print(f"{r['workload']:9} {'on' if r['spill'] else 'off':5} {r['requests']:8d} {r['ttft_p50_s']:11.3f} "
              f"{r['ttft_p99_s']:11.3f} {r['prompt_tokens_computed']:16.0f} {r['restored_tokens']:9.0f}")


if __name__ == "__main__":
    main()
