#!/usr/bin/env python3
"""The semantic cache on a live server: a workload of paraphrased repeats.

    python3 bench/semantic_cache.py --metro build/bin/metro \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --embed minilm.gguf [--requests 600]

bench/semantic/paraphrases.json holds 30 questions asked four ways each; neighbouring
questions differ in one entity or word (France / Germany, boil / fry, plus / times). The
workload draws its requests from the 120 phrasings at random (seeded), so each question
recurs in other words. It runs twice on fresh servers, cache off and on (greedy chat,
max_tokens 32, 4 clients), and reports:
  - hit rate, and hit / miss latency (client-side, whole response);
  - wrong-question hits: hits answered with another question's answer (the answer text of a
    hit, looked up among the answers the cache-off run computed for each question);
  - answer changes: hits whose text differs from what the cache-off run computed for the
    same phrasing (a paraphrase may get other words from the model even when right);
  - what the engine computed: prompt and output tokens (from /metrics).
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def serve(args, cache):
    cmd = [args.metro, "serve", "-m", args.model, "--model-name", "m", "--port", "0", "--admission", "off",
           "-t", str(args.threads), "--ctx", "512"]
    if cache:
        cmd += ["--semantic-cache", "--cache-embed-model", args.embed, "--cache-verify-share", "0",
                "--cache-threshold", str(args.threshold)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    while port is None:
        line = p.stdout.readline()
        if not line:
            sys.exit("server exited")
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5).status == 200:
                break
        except Exception:
            time.sleep(0.1)
    return p, port


def chat(port, text):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 32,
            "metro": {"semantic_cache": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return r, time.perf_counter() - t0


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " "))


def run(args, cache, work):
    p, port = serve(args, cache)
    try:
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as ex:
            out = list(ex.map(lambda w: chat(port, w[1]), work))
        wall = time.time() - t0
        tokens = (metric(port, "metro_prompt_tokens_total"), metric(port, "metro_generation_tokens_total"))
    finally:
        p.kill()
    return out, wall, tokens


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metro", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--embed", required=True, help="encoder GGUF for --cache-embed-model")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=0.90)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    groups = json.load(open(os.path.join(HERE, "semantic", "paraphrases.json")))["groups"]
    phrasings = [(g, t) for g, texts in enumerate(groups) for t in texts]
    rng = random.Random(args.seed)
    work = [rng.choice(phrasings) for _ in range(args.requests)]

    off, off_wall, off_tokens = run(args, False, work)
    fresh = {}  # phrasing -> what the model answers it
    by_group = {}  # answer text -> the questions it answered
    for (g, t), (r, _) in zip(work, off):
        text = r["choices"][0]["message"]["content"]
        fresh[t] = text
        by_group.setdefault(text, set()).add(g)
    on, on_wall, on_tokens = run(args, True, work)
    hits = [(w, r, dt) for w, (r, dt) in zip(work, on) if "metro" in r]
    misses = [dt for (r, dt) in on if "metro" not in r]
    wrong_q = sum(1 for (g, t), r, _ in hits if g not in by_group.get(r["choices"][0]["message"]["content"], {g}))
    changed = sum(1 for (g, t), r, _ in hits if r["choices"][0]["message"]["content"] != fresh[t])
    print(f"requests {len(work)} ({len(groups)} questions x 4 phrasings, drawn at random), {args.clients} clients, "
          f"threshold {args.threshold}")
    print(f"cache off: {off_wall:.1f} s, engine prompt tokens {off_tokens[0]:.0f}, output tokens {off_tokens[1]:.0f}")
    print(f"cache on:  {on_wall:.1f} s, engine prompt tokens {on_tokens[0]:.0f}, output tokens {on_tokens[1]:.0f}")
    print(f"hits {len(hits)} ({100.0 * len(hits) / len(work):.1f}%); wrong-question hits {wrong_q} "
          f"({100.0 * wrong_q / max(1, len(hits)):.2f}% of hits); answer changed vs computing the phrasing "
          f"{changed} ({100.0 * changed / max(1, len(hits)):.1f}% of hits)")
    hit_dt = [dt for _, _, dt in hits]
    print(f"latency: hit p50 {1000 * pct(hit_dt, 0.5):.1f} ms p99 {1000 * pct(hit_dt, 0.99):.1f} ms; "
          f"miss p50 {1000 * pct(misses, 0.5):.1f} ms p99 {1000 * pct(misses, 0.99):.1f} ms; "
          f"cache-off p50 {1000 * pct([dt for _, dt in off], 0.5):.1f} ms")


if __name__ == "__main__":
    main()
