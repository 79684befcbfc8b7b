#!/usr/bin/env python3
"""The four SLA scheduling benchmarks of docs/benchmarks.md, each `--sched sla` vs `--sched fcfs`,
against a real `metro serve` with the default model, driven by `metro bench-serve`.

    python3 bench/sla_scenarios.py [--metro build/bin/metro] [--model M] [--threads 2]
                                   [--scenarios 1,2,3,4] [--scale 1.0] [--out DIR]
                                   [--mix2 lognormal,loguniform,bimodal] [--seed2 2] [--rounds2 1]
                                   [--rate2 R] [--load2 0.9] [--capacity-runs 3]
                                   [--capacity-def measured|model] [--requests2 N] [--variants2 sla]
                                   [--slack2] [--strict2] [--quiet4 1.5]
                                   [--serve-args "--kv-type q8_0"]

1. 20% realtime short + 80% batch long requests at 1.5x capacity: realtime p99 TTFT, and
   total output throughput.
2. Mixed lengths, one class, at 90% load: mean TTFT (sla also with --tpot-cap lower), on
   three mixes (--mix2): chat-like lognormal lengths, the simulator's log-uniform ones (prompts
   16-2048, outputs 8-512: as many 16-31 token prompts as 1024-2047 token ones), and short
   chats mixed with long documents (bimodal).
3. The same at capacity and at 2x: goodput (requests meeting their class SLO per second).
4. Two tenants, one sending 10x the other's rate, both past their share (the quiet one at
   1.5x capacity, --quiet4): the quiet tenant's share of generated tokens while both are
   backlogged (each has a prompt waiting for its first token), and while it is still sending.

"Capacity" is measured first in each scenario: requests/s the server completes with the
scenario's mix when offered everything at once (FCFS, admission off); the median of
--capacity-runs such runs (default 3: one run moved 1.42-1.74 req/s within an hour). With
--capacity-def model it is instead the rate at which the engine's own step-cost fit (read
from /metrics after each capacity run) says the scenario's requests fill its time, the fixed
cost per step left out: the simulator's definition of load (scenario 2 also prints each run's
load offered by that fit). Every figure printed is a
measurement of this run; JSON of every bench-serve run goes to --out.
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain station engine signal").split()
KEYS = "sk-bench-quiet-000000 quiet\nsk-bench-loud-0000000 loud\nsk-bench-any-00000000 anyone\n"


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def wait_ready(port, timeout=120):
    """Until the server on `port` answers /ready with 200 (its model is loaded)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.3)
    raise RuntimeError("metro serve did not become ready")


class Server:
    def __init__(self, args, sched, admission, extra=()):
        self.port = 18000 + random.randint(0, 999)
        self.cmd = [args.metro, "serve", "-m", args.model, "--port", str(self.port), "-t", str(args.threads),
                    "--sched", sched, "--admission", admission, "--api-key-file", args.keys,
                    "--max-seqs", "64", "--ttft-margin", "1"] + args.serve_args.split() + list(extra)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_ready(self.port)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def bench(args, url, name, extra, key="sk-bench-any-00000000", background=False):
    out = os.path.join(args.out, name + ".json")
    cmd = [args.metro, "bench-serve", "--url", url, "--api-key", key, "--quiet", "--json", out,
           "--timeout", "900"] + extra
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT), out
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def load(path):
    with open(path) as f:
        return json.load(f)


def step_cost(url):
    """The engine's fitted step cost (metro_engine_step_cost_seconds on /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^metro_engine_step_cost_seconds\{(?:model="[^"]*",)?term="(\w+)"\} (\S+)$', text, re.M)}


def request_compute(cost, p, o):
    """Seconds of engine time the fit gives a request of p prompt and o output tokens: every
    token's matmuls, the prompt's (query, key) pairs, each decode's keys."""
    return (p * cost["per_prefill_token"] + o * cost["per_decode_seq"] + cost["per_attention_pair"] * p * (p + 1) / 2
            + cost["per_decode_ctx"] * (o * p + o * (o + 1) / 2))


def model_capacity(cost, shapes):
    """Requests/s at which the engine's fitted per-token and attention costs of requests of
    these (prompt tokens, output tokens) fill its time: one over their mean compute, the
    fixed cost per step left out (it depends on how full steps are, the policies' business).
    The simulator's definition (tests/sched/sim/scenarios.h, capacity_rate), so loads mean
    the same in both."""
    total = sum(request_compute(cost, p, o) for p, o in shapes)
    return len(shapes) / total if total > 0 else float("nan")


def served_shapes(reqs):
    return [(q["prompt_tokens"], q["completion_tokens"]) for q in reqs
            if q.get("prompt_tokens") is not None and q.get("completion_tokens") is not None]


def dataset_shapes(path, n, reqs):
    """(prompt tokens, output tokens) of the first n requests of a JSONL dataset, prompt
    tokens estimated from its words at the tokens per word the served requests `reqs` (the
    dataset's first ones) measured, outputs at max_tokens (bench-serve ignores EOS)."""
    with open(path) as f:
        recs = [json.loads(line) for line, _ in zip(f, range(n))]
    words = [len(r["prompt"].split()) for r in recs]
    served = [(w, q["prompt_tokens"]) for w, q in zip(words, reqs) if q.get("prompt_tokens")]
    per_word = sum(t for _, t in served) / max(1, sum(w for w, _ in served))
    return [(w * per_word, r["max_tokens"]) for w, r in zip(words, recs)]


def capacity(args, mix_args, n, sample=None):
    """Requests/s completed with everything offered at once (FCFS, no admission); with
    --capacity-runs K the median of K such runs, each on a fresh server. With
    --capacity-def model: the rate at which the step-cost fit of each such run's engine
    says the scenario's requests fill the engine's time (model_capacity): `sample` (the
    dataset file and its request count) when given, as a capacity run's first requests can
    be lighter than the whole run's (the first 100 of scenario 2's bimodal sample of 2000
    need 10% less compute than all 2000), else the capacity run's own requests. Returns
    (capacity, the median run's fit)."""
    rates, models, fits = [], [], []
    for k in range(max(1, args.capacity_runs)):
        srv = Server(args, "fcfs", "off")
        try:
            r = bench(args, srv.url, f"capacity-{abs(hash(tuple(mix_args))) % 10000}-{k}",
                      mix_args + ["--rate", "inf", "--max-concurrency", "32", "--num-requests", str(n)])
            cost = step_cost(srv.url)
        finally:
            srv.stop()
        run = r["runs"][0]
        reqs = run.get("requests") or []
        rates.append(run["overall"]["ok"] / run["duration_s"])
        shapes = dataset_shapes(sample[0], sample[1], reqs) if sample else served_shapes(reqs)
        models.append(model_capacity(cost, shapes))
        fits.append(cost)
    over = "the scenario's requests" if sample else "the capacity run's requests"
    print("capacity runs: " + ", ".join(f"{x:.3f}" for x in rates) + " req/s measured; by the step-cost fit "
          f"(fixed cost left out, over {over}): " + ", ".join(f"{x:.3f}" for x in models) + " req/s", flush=True)
    chosen = models if args.capacity_def == "model" else rates
    mid = sorted(range(len(chosen)), key=lambda i: chosen[i])[len(chosen) // 2]
    return chosen[mid], fits[mid]


def offered_load(cost, reqs):
    """The load a run offered by the fit: its requests' compute over the span of their
    sending (what the simulator calls load)."""
    sent = [q["sent_s"] for q in reqs if q.get("sent_s") is not None]
    span = max(sent) - min(sent) if len(sent) > 1 else 0.0
    total = sum(request_compute(cost, p, o) for p, o in served_shapes(reqs))
    return total / span if span > 0 else float("nan")


def write_mix(path, rng, n, realtime_frac):
    with open(path, "w") as f:
        for _ in range(n):
            if rng.random() < realtime_frac:
                rec = {"prompt": words(rng, 48), "max_tokens": 16, "class": "realtime"}
            else:
                rec = {"prompt": words(rng, 384), "max_tokens": 128, "class": "batch"}
            f.write(json.dumps(rec) + "\n")


SLO = "realtime:ttft=0.5,tpot=0.1;standard:ttft=2,tpot=0.2;batch:ttft=30,tpot=1;default:ttft=2,tpot=0.2"


def scenario1(args):
    rng = random.Random(1)
    n = int(120 * args.scale)
    mix = os.path.join(args.out, "mix1.jsonl")
    write_mix(mix, rng, n, 0.2)
    cap, _ = capacity(args, ["--dataset", mix], n)
    rate = 1.5 * cap
    rows = {}
    for sched in ("sla", "fcfs"):
        srv = Server(args, sched, "auto")
        try:
            r = bench(args, srv.url, f"s1-{sched}", ["--dataset", mix, "--rate", f"{rate:.3f}", "--seed", "1",
                                                     "--num-requests", str(n), "--slo", SLO])
        finally:
            srv.stop()
        run = r["runs"][0]
        rt = run["classes"].get("realtime", {})
        rows[sched] = {
            "realtime_ttft_p99": (rt.get("ttft_s") or {}).get("p99"),
            "realtime_ok": rt.get("ok"),
            "batch_ok": run["classes"].get("batch", {}).get("ok"),
            "refused": run["overall"]["failed"],
            "out_tps": run["overall"]["throughput"]["output_tokens_per_s"],
            "duration_s": run["duration_s"],
        }
    print(f"\n## 1. 20% realtime (48 words -> 16 tokens) + 80% batch (384 words -> 128 tokens) at 1.5x capacity")
    print(f"capacity {cap:.2f} req/s (all at once, FCFS); offered {rate:.2f} req/s, {n} requests")
    print("| sched | realtime TTFT p99 s | realtime ok | batch ok | refused | output tok/s |")
    print("|---|---|---|---|---|---|")
    for s, v in rows.items():
        print(f"| {s} | {v['realtime_ttft_p99']:.3f} | {v['realtime_ok']} | {v['batch_ok']} | {v['refused']} | "
              f"{v['out_tps']:.1f} |")
    a, b = rows["sla"], rows["fcfs"]
    print(f"realtime p99 TTFT fcfs/sla = {b['realtime_ttft_p99'] / a['realtime_ttft_p99']:.1f}x; "
          f"throughput sla/fcfs = {a['out_tps'] / b['out_tps']:.3f}")


# Scenario 2's mixes: (title, bench-serve arguments without the seed).
MIXES2 = {
    "lognormal": ("lognormal lengths (in median 128, sigma 1; out median 48, sigma 0.8)",
                  ["--dataset", "synthetic", "--input-len", "lognormal:128,1.0,1024", "--output-len",
                   "lognormal:48,0.8,256"]),
    "loguniform": ("log-uniform lengths (in 16-2048, out 8-512; the simulator's mix)",
                   ["--dataset", "synthetic", "--input-len", "loguniform:16-2048", "--output-len",
                    "loguniform:8-512"]),
    # Written per run by write_bimodal (a JSONL file: the lengths of a request go together).
    "bimodal": ("short chats and long documents (80%: in 32-256 words, out 16-128; 20%: in 1024-2048, "
                "out 64-256)", None),
}


def write_bimodal(path, rng, n):
    with open(path, "w") as f:
        for _ in range(n):
            if rng.random() < 0.2:
                rec = {"prompt": words(rng, rng.randint(1024, 2048)), "max_tokens": rng.randint(64, 256)}
            else:
                rec = {"prompt": words(rng, rng.randint(32, 256)), "max_tokens": rng.randint(16, 128)}
            f.write(json.dumps(rec) + "\n")


MIXED = MIXES2["lognormal"][1] + ["--seed", "2"]  # scenario 3's mix


def scenario2(args):
    for mix in args.mix2.split(","):
        scenario2_mix(args, *MIXES2[mix], mix_name=mix)


def scenario2_mix(args, title, mix_args, mix_name):
    n = args.requests2 or int(100 * args.scale)
    sample = None
    if mix_args is None:
        path = os.path.join(args.out, f"mix2-{mix_name}-{args.seed2}.jsonl")
        write_bimodal(path, random.Random(args.seed2), n)
        mix_args = ["--dataset", path]
        sample = (path, n)
    mixed = mix_args + ["--seed", str(args.seed2)]
    fit = None
    if args.rate2 > 0:
        cap, loads = None, [None]
    else:
        cap, fit = capacity(args, mixed, int(100 * args.scale), sample)
        loads = [float(x) for x in args.load2.split(",")]
    # sla: the default (--tpot-cap all); sla-lower: steps capped by TPOT against lower
    # classes only, so one class gets FCFS-sized steps (docs/scheduling.md, "Step cap").
    variants = [("sla", "sla", ()), ("sla-lower", "sla", ("--tpot-cap", "lower"))]
    if args.slack2:
        variants.append(("sla-slack", "sla", ("--tpot-slack", "on")))
    if args.strict2:
        # Strict pacing: decodes paced at 0.8 x TPOT, a quarter of the step kept from seats
        # (docs/scheduling.md, "On the engine as measured").
        variants.append(("sla-strict", "sla", ("--tpot-slack", "off", "--decode-share", "0.75")))
    variants.append(("fcfs", "fcfs", ()))
    if args.variants2:
        keep = args.variants2.split(",") + ["fcfs"]
        variants = [v for v in variants if v[0] in keep]
    # Near capacity one run says little (this host's speed drifts between minutes), so
    # --rounds2 runs the policies in turn, round after round, and reports every round;
    # --load2 repeats that at several loads (the capacity measured first is itself an
    # estimate: it moved 1.42-1.74 req/s between runs of one hour, and FCFS's mean TTFT
    # moved 4.5x between 1.27 and 1.42 req/s in that hour).
    for load in loads:
        rate = args.rate2 if load is None else load * cap
        rows = []  # (round, name, overall, load offered by the capacity run's step-cost fit)
        for rd in range(args.rounds2):
            for name, sched, extra in variants:
                srv = Server(args, sched, "off", extra)
                suffix = f"-{rd}" if args.rounds2 > 1 else ""
                tag = "" if load is None or len(loads) == 1 else f"-{load:g}"
                try:
                    r = bench(args, srv.url, f"s2-{mix_name}-{name}{tag}{suffix}",
                              mixed + ["--rate", f"{rate:.3f}", "--num-requests", str(n), "--slo", SLO])
                finally:
                    srv.stop()
                run = r["runs"][0]
                load_fit = offered_load(fit, run.get("requests") or []) if fit else float("nan")
                rows.append((rd, name, run["overall"], load_fit))
        where = f"at {load:.0%} load" if load is not None else f"at {rate:.3f} req/s (--rate2)"
        print(f"\n## 2. Mixed lengths, {title}, one class, {where}")
        cap_s = f"capacity {cap:.3f} req/s; " if cap is not None else "capacity not measured (--rate2); "
        print(f"{cap_s}offered {rate:.3f} req/s, {n} requests, seed {args.seed2}, {args.rounds2} round(s)")
        print("| round | sched | TTFT mean s | TTFT p50 s | TTFT p99 s | TPOT mean s | TPOT p99 s | E2E mean s "
              "| output tok/s | SLO met (TTFT <= 2 s and TPOT <= 0.2 s) | load offered (by the fit) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for rd, s, g, lf in rows:
            print(f"| {rd} | {s} | {g['ttft_s']['mean']:.3f} | {g['ttft_s']['p50']:.3f} | {g['ttft_s']['p99']:.3f} | "
                  f"{g['tpot_s']['mean']:.3f} | {g['tpot_s']['p99']:.3f} | "
                  f"{g['e2e_s']['mean']:.2f} | {g['throughput']['output_tokens_per_s']:.1f} | "
                  f"{g['goodput']['fraction']:.0%} | {lf:.0%} |")
        fcfs = {rd: g["ttft_s"]["mean"] for rd, s, g, _ in rows if s == "fcfs"}
        for name, _, _ in variants[:-1]:
            ratios = [fcfs[rd] / g["ttft_s"]["mean"] for rd, s, g, _ in rows if s == name]
            print(f"mean TTFT fcfs/{name} per round: " + ", ".join(f"{x:.2f}x" for x in ratios) +
                  f" (median {statistics.median(ratios):.2f}x)", flush=True)


def scenario3(args):
    n = int(100 * args.scale)
    cap, _ = capacity(args, MIXED, n)
    rows = []
    for sched, adm in (("sla", "auto"), ("fcfs", "off")):
        for load in (1.0, 2.0):
            srv = Server(args, sched, adm)
            try:
                r = bench(args, srv.url, f"s3-{sched}-{load}", MIXED + [
                    "--rate", f"{load * cap:.3f}", "--num-requests", str(int(n * load)), "--slo", SLO])
            finally:
                srv.stop()
            g = r["runs"][0]["overall"]
            rows.append((sched, load, g))
    print(f"\n## 3. Goodput at capacity and at 2x (mixed lengths; SLO TTFT 2 s, TPOT 0.2 s)")
    print(f"capacity {cap:.2f} req/s")
    print("| sched | load | offered req | ok | refused | good req/s | goodput fraction | TTFT p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    good = {}
    for sched, load, g in rows:
        gp = g["goodput"]
        good[(sched, load)] = gp["requests_per_s"]
        print(f"| {sched} | {load:.0f}x | {g['requests']} | {g['ok']} | {g['failed']} | {gp['requests_per_s']:.3f} | "
              f"{gp['fraction']:.2f} | {(g['ttft_s'] or {}).get('p99') or float('nan'):.2f} |")
    for sched in ("sla", "fcfs"):
        print(f"{sched}: goodput at 2x / at 1x = {good[(sched, 2.0)] / max(1e-9, good[(sched, 1.0)]):.2f}")


def tokens_in(reqs, t_end):
    """Output tokens of these requests generated in [0, t_end] (client clock)."""
    total = 0.0
    for r in reqs:
        if r["done_s"] is None or not r["completion_tokens"] or r["ttft_s"] is None:
            continue
        a, b, n = r["sent_s"] + r["ttft_s"], r["done_s"], r["completion_tokens"]
        if b <= a:
            total += n if b <= t_end else 0
        else:
            total += n * max(0.0, min(b, t_end) - a) / (b - a)
    return total


def waiting_spans(reqs):
    """Merged intervals (client clock) during which one of these requests was sent and had
    not yet had its first token: the tenant had work queued at the server."""
    spans = sorted((r["sent_s"], r["sent_s"] + r["ttft_s"]) for r in reqs
                   if r["sent_s"] is not None and r["ttft_s"] is not None)
    out = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def tokens_over(reqs, spans):
    """Output tokens of these requests generated inside the spans."""
    return sum(tokens_in(reqs, b) - tokens_in(reqs, a) for a, b in spans)


def scenario4(args):
    common = ["--dataset", "synthetic", "--input-len", "128", "--output-len", "64", "--seed", "4"]
    n_quiet = int(30 * args.scale)
    cap, _ = capacity(args, common, int(60 * args.scale))
    qr = args.quiet4 * cap
    print(f"\n## 4. Two tenants, the loud one at 10x the quiet one's rate")
    print(f"capacity {cap:.2f} req/s; quiet offers {qr:.2f} req/s, loud {10 * qr:.2f} req/s")
    print("| sched | quiet tokens | loud tokens | quiet share while quiet sends | quiet share while both wait "
          "(span s) | quiet TTFT mean / max s |")
    print("|---|---|---|---|---|---|")
    for sched in ("sla", "fcfs"):
        srv = Server(args, sched, "off")
        try:
            pq, out_q = bench(args, srv.url, f"s4-{sched}-quiet", common + [
                "--rate", f"{qr:.3f}", "--num-requests", str(n_quiet)], key="sk-bench-quiet-000000",
                background=True)
            pl, out_l = bench(args, srv.url, f"s4-{sched}-loud", common + [
                "--rate", f"{10 * qr:.3f}", "--num-requests", str(10 * n_quiet)], key="sk-bench-loud-0000000",
                background=True)
            pq.wait()
            pl.wait()
        finally:
            srv.stop()
        q = load(out_q)["runs"][0]["requests"]
        lo = load(out_l)["runs"][0]["requests"]
        # Both backlogged: from the start until the quiet tenant's last request was sent
        # (after that it only drains). A request's tokens are spread evenly between its first
        # token and its end (bench-serve keeps no per-token times in its JSON).
        t_end = max(r["sent_s"] for r in q if r["sent_s"] is not None)
        tq, tl = tokens_in(q, t_end), tokens_in(lo, t_end)
        qt = [r["ttft_s"] for r in q if r["ttft_s"] is not None]
        qt_s = f"{sum(qt) / len(qt):.2f} / {max(qt):.2f}" if qt else "-"
        # Both backlogged, strictly: each tenant has a prompt waiting for its first token.
        both = intersect(waiting_spans(q), waiting_spans(lo))
        bq, bl = tokens_over(q, both), tokens_over(lo, both)
        span = sum(b - a for a, b in both)
        print(f"| {sched} | {tq:.0f} | {tl:.0f} | {tq / max(1.0, tq + tl):.1%} | "
              f"{bq / max(1.0, bq + bl):.1%} ({span:.1f}) | {qt_s} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metro", default=os.path.join(ROOT, "build/bin/metro"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scenarios", default="1,2,3,4")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    ap.add_argument("--capacity-runs", type=int, default=3,
                    help="capacity: the median of this many runs (each scenario's first measurement)")
    ap.add_argument("--capacity-def", choices=("measured", "model"), default="measured",
                    help="capacity: req/s measured with everything offered at once, or (model) the rate at "
                         "which the engine's step-cost fit says the mix fills its time, fixed cost left out "
                         "(the simulator's definition)")
    ap.add_argument("--requests2", type=int, default=0,
                    help="scenario 2: requests per run (default 100 x --scale; its capacity runs keep 100 x --scale)")
    ap.add_argument("--variants2", default="",
                    help="scenario 2: the sla variants to run besides fcfs, e.g. \"sla\" (default: all)")
    ap.add_argument("--load2", default="0.9",
                    help="scenario 2: loads as fractions of the capacity, comma-separated (e.g. 0.8,0.9,1)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--mix2", default="lognormal,loguniform,bimodal",
                    help="scenario 2's mixes: lognormal, loguniform, bimodal")
    ap.add_argument("--seed2", type=int, default=2, help="scenario 2's bench-serve seed")
    ap.add_argument("--rounds2", type=int, default=1, help="scenario 2: rounds of the policies in turn")
    ap.add_argument("--rate2", type=float, default=0.0,
                    help="scenario 2: offered req/s (default: 0.9 x the capacity measured first)")
    ap.add_argument("--slack2", action="store_true",
                    help="scenario 2: also run sla with --tpot-slack on (the default)")
    ap.add_argument("--strict2", action="store_true",
                    help="scenario 2: also run sla with --tpot-slack off --decode-share 0.75 (strict pacing)")
    ap.add_argument("--serve-args", default="",
                    help="more `metro serve` options for every server of the run, e.g. \"--kv-type q8_0\"")
    ap.add_argument("--quiet4", type=float, default=1.5,
                    help="scenario 4: the quiet tenant's rate as a multiple of capacity (the loud one sends 10x)")
    args = ap.parse_args()
    args.out = args.out or tempfile.mkdtemp(prefix="metro-sla-")
    os.makedirs(args.out, exist_ok=True)
    args.keys = os.path.join(args.out, "keys.txt")
    with open(args.keys, "w") as f:
        f.write(KEYS)
    print(f"metro sla scenarios: {args.metro} on {os.path.basename(args.model)}, {args.threads} threads; "
          f"JSON in {args.out}")
    fns = {"1": scenario1, "2": scenario2, "3": scenario3, "4": scenario4}
    for s in args.scenarios.split(","):
        t0 = time.time()
        fns[s](args)
        print(f"(scenario {s}: {time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
