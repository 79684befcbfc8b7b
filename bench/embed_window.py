#!/usr/bin/env python3
"""The embeddings batching window (`metro serve --embed-window on`) against no window, on a
real server with the default model: /v1/embeddings requests arrive (Poisson) at each rate;
per rate the script prints latency (mean, p50, p99), throughput, and from /metrics the engine
steps and engine busy seconds (the sum of step durations) per request.

    python3 bench/embed_window.py [--metro build/bin/metro] [--model M] [--threads 2]
                                  [--rates 2,8,32,inf] [--requests 200] [--class standard]
                                  [--words 8-64] [--seed 1] [--extra "--embed-max-wait 0.05"]

`inf` releases every request at once (a throughput run). Every figure printed is a
measurement of this run. Admission control is off on both servers (`--admission off`), so
that every request is served and the two runs do the same work.
"""

import argparse
import concurrent.futures
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from sla_scenarios import WORDS, wait_ready

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Server:
    def __init__(self, args, window):
        self.port = 19000 + random.randint(0, 999)
        cmd = [args.metro, "serve", "-m", args.model, "--port", str(self.port), "-t", str(args.threads),
               "--admission", "off", "--embed-window", window] + shlex.split(args.extra if window == "on" else "")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_ready(self.port)

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for name in ("metro_engine_step_duration_seconds_sum", "metro_engine_step_duration_seconds_count",
                     "metro_embed_window_batches_total", "metro_embed_window_submitted_total"):
            m = re.search(r"^" + name + r'(?:\{model="[^"]*"\})? ([0-9.e+-]+)$', text, re.M)
            out[name] = float(m.group(1)) if m else 0.0
        return out

    def embed(self, text, cls):
        body = json.dumps({"input": text}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json", "X-Metro-Class": cls})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as r:
            json.load(r)
        return time.perf_counter() - t0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def run_rate(server, rate, texts, cls, seed):
    rng = random.Random(seed)
    lat = []
    lock = threading.Lock()
    before = server.metrics()
    t_start = time.perf_counter()

    def one(text):
        s = server.embed(text, cls)
        with lock:
            lat.append(s)

    with concurrent.futures.ThreadPoolExecutor(max_workers=256) as pool:
        futures = []
        due = time.perf_counter()
        for text in texts:
            if rate != float("inf"):
                due += rng.expovariate(rate)
                time.sleep(max(0.0, due - time.perf_counter()))
            futures.append(pool.submit(one, text))
        for f in futures:
            f.result()
    wall = time.perf_counter() - t_start
    after = server.metrics()
    d = {k: after[k] - before[k] for k in after}
    n = len(texts)
    lat.sort()
    return {
        "rate": rate, "requests": n, "wall_s": wall, "throughput": n / wall,
        "mean_s": statistics.mean(lat), "p50_s": lat[n // 2], "p99_s": lat[min(n - 1, int(0.99 * n))],
        "steps_per_req": d["metro_engine_step_duration_seconds_count"] / n,
        "busy_ms_per_req": 1e3 * d["metro_engine_step_duration_seconds_sum"] / n,
        "batches": d["metro_embed_window_batches_total"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metro", default=os.path.join(ROOT, "build/bin/metro"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rates", default="2,8,32,inf")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--class", dest="cls", default="standard", choices=["realtime", "standard", "batch"])
    ap.add_argument("--words", default="8-64", help="words per input, LO-HI")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra", default="", help="more `metro serve` flags for the window-on server")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.words.split("-"))
    rng = random.Random(args.seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(args.requests)]
    rates = [float(r) for r in args.rates.split(",")]
    results = []
    print(f"{args.requests} /v1/embeddings requests of {args.words} words, class {args.cls}, -t {args.threads}")
    print(f"{'window':>6} {'rate':>6} {'req/s':>7} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'steps/req':>9} {'busy ms/req':>11} {'batches':>7}")
    for window in ("off", "on"):
        server = Server(args, window)
        try:
            server.embed("warm up", args.cls)
            for i, rate in enumerate(rates):
                r = run_rate(server, rate, texts, args.cls, args.seed + i)
                r["window"] = window
                results.append(r)
                print(f"{window:>6} {rate:>6g} {r['throughput']:7.1f} {1e3 * r['mean_s']:8.1f} "
                      f"{1e3 * r['p50_s']:7.1f} {1e3 * r['p99_s']:7.1f} {r['steps_per_req']:9.3f} "
                      f"{r['busy_ms_per_req']:11.2f} {r['batches']:7.0f}", flush=True)
        finally:
            server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
