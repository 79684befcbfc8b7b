#!/usr/bin/env python3
"""`metro router` policies on a shared-prefix workload (docs/benchmarks.md, "Router").

    python3 bench/router_prefix.py --metro build/bin/metro \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--requests 96] [--policies prefix,round-robin] \
        [--routers 2] [--policies prefix,prefix+events,round-robin]

Two replicas (`metro serve -t 1` each: the two cores split between them) behind a router per
policy, fresh for each. The workload: 8 long system prompts (about 1,000 tokens each) and
short questions, requests drawn at random (seeded) from 8 x 12 combinations, 4 clients,
streamed, max_tokens 32. Each replica's KV budget (--ctx-total, default 6,144 tokens) holds
about half of the prompts: a policy that sends a prompt's requests to the replica that
holds it computes each prompt about once; one that spreads them makes both replicas cycle
through all eight, evicting and computing them again. Reports output tokens/s over the run
and TTFT p50 / p99 per policy.

`--routers N` puts N routers in front of the same two replicas (a highly available pair, say),
the clients' requests alternating between them: each router alone knows only what it routed.
The policy `prefix+events` is `prefix` with every router reading both replicas' KV events
(`metro serve --kv-events`, `metro router --kv-events`), so each sees what the others sent.
The policy `nginx` puts nginx (Debian's, `apt-get install nginx-light`; a peer, not a
dependency) in front of the same replicas instead: its default round-robin upstream,
responses unbuffered so that streams pass as they come.
"""
import argparse
import concurrent.futures
import json
import random
import re
import os
import socket
import tempfile
import subprocess
import sys
import threading
import time
import urllib.request


def start(cmd, pattern):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while True:
        line = p.stdout.readline()
        if not line:
            sys.exit("exited: " + " ".join(cmd))
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return p, int(m.group(1))


def ready(port):
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5).status == 200:
                return
        except Exception:
            time.sleep(0.1)


def stream_chat(port, messages, max_tokens):
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, n = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("choices") and d["choices"][0]["delta"].get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                n += 1
    return ttft or (time.perf_counter() - t0), n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(ports):
    """nginx on a free port proxying round-robin to the replicas; returns (process, port)."""
    d = tempfile.mkdtemp(prefix="router_prefix_nginx")
    port = free_port()
    servers = "".join(f"server 127.0.0.1:{p};" for p in ports)
    conf = (f"pid {d}/nginx.pid; error_log stderr; worker_processes 1; events {{ worker_connections 1024; }}"
            f"http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};"
            f" upstream replicas {{ {servers} }}"
            f" server {{ listen 127.0.0.1:{port}; client_max_body_size 32m;"
            f" location / {{ proxy_pass http://replicas; proxy_http_version 1.1; proxy_buffering off;"
            f" proxy_read_timeout 600s; }} }} }}")
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    p = subprocess.Popen(["nginx", "-c", path, "-p", d, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    sys.exit("nginx did not start")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metro", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--policies", default="prefix,round-robin")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", type=int, default=1, help="routers in front of the replicas, used in turn")
    ap.add_argument("--ctx-total", type=int, default=6144,
                    help="each replica's KV budget in tokens: by default about half of the 8 prompts fit, as "
                         "when a fleet's working set exceeds one replica's cache")
    args = ap.parse_args()
    topics = ["shipping logistics", "medical billing", "tax law", "kitchen safety", "aircraft maintenance",
              "retail returns", "hotel bookings", "software licensing"]
    systems = [(f"You are an assistant for {t}. " + " ".join(
        f"Rule {i}: in matters of {t}, be precise about item {i} and cite the relevant clause {i * 7 % 31}."
        for i in range(60))) for t in topics]
    rng = random.Random(args.seed)
    work = [(rng.randrange(8), rng.randrange(12)) for _ in range(args.requests)]
    for name in args.policies.split(","):
        policy, events = name.removesuffix("+events"), name.endswith("+events")
        ev_ports = [free_port() for _ in range(2)] if events else []
        reps = [start([args.metro, "serve", "-m", args.model, "--model-name", "m", "--port", "0", "-t", "1",
                       "--ctx", "2048", "--ctx-total", str(args.ctx_total), "--admission", "off"] +
                      (["--kv-events", f"tcp://*:{ev_ports[k]}"] if events else []),
                      r"listening on http://[\d.]+:(\d+)") for k in range(2)]
        for _, port in reps:
            ready(port)
        if policy == "nginx":
            routers = [start_nginx([p for _, p in reps]) for _ in range(args.routers)]
        else:
            routers = [start([args.metro, "router", "--port", "0", "--policy", policy] +
                             sum([["--upstream", f"http://127.0.0.1:{p}"] for _, p in reps], []) +
                             sum([["--kv-events", f"tcp://127.0.0.1:{e}"] for e in ev_ports], []),
                             r"listening on http://[\d.]+:(\d+)") for _ in range(args.routers)]
        if events:
            time.sleep(1)  # the subscribers join before the first store
        try:
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as ex:
                out = list(ex.map(lambda iw: stream_chat(routers[iw[0] % len(routers)][1], [
                    {"role": "system", "content": systems[iw[1][0]]},
                    {"role": "user", "content": f"Question {iw[1][1]}: what applies here?"}], 32), enumerate(work)))
            wall = time.time() - t0
        finally:
            for r, _ in routers:
                r.kill()
            for p, _ in reps:
                p.kill()
        tok = sum(n for _, n in out)
        ttfts = [t for t, _ in out]
        print(f"{name:14s} {len(work)} requests in {wall:.1f} s: {tok / wall:.1f} output tok/s, "
              f"TTFT p50 {pct(ttfts, 0.5):.2f} s p99 {pct(ttfts, 0.99):.2f} s", flush=True)


if __name__ == "__main__":
    main()
