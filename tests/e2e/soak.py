"""Soak: `metro serve` under an open-loop load of twice what it can serve, for a long time,
with every kind of request and client misbehaviour mixed in, then an account of every
request. Not part of `make test` (it runs for an hour by default); see docs/reliability.md.

    tests/e2e/run_soak.sh BUILD_DIR [--duration 3600] [--load 2.0] [--report FILE]

Phases:
1. Calibration: closed loop, one client per engine seat, the same request mix without the
   misbehaviour, for --calibrate seconds. Capacity = requests completed per second.
2. Soak: Poisson arrivals at --load x capacity for --duration seconds. Tenants with
   different classes and quotas; chat and completions, streamed and not, n=2, logprobs,
   embeddings, a shared system prompt (prefix cache), deadlines; clients that hang up
   mid-stream, clients that hang up before their first token, malformed bodies.
3. Account: every request ends in exactly one bucket. `ok` (complete and well formed),
   `refused` (429/503 with an error body: not accepted), `shed` (accepted, then answered
   deadline_missed: no first token by the deadline admission set, or a stream paused past
   it, ended with that error event and [DONE]), `rejected_as_expected`
   (400 to a malformed body), `aborted` (the client hung up on purpose). Anything else is `lost`: a
   200 whose stream ends without [DONE], a reset nobody asked for, a 5xx other than 503, a
   400 to a valid body, no answer within the client's patience: --patience seconds, or what
   the server promises a request of its class and length if that is longer (see PROMISE).
4. After the load: the server must settle to 0 requests in flight, 0 running, 0 KV blocks
   referenced, answer a normal request, and exit 0 on SIGTERM. Its RSS is sampled all
   along; growth over the second half of the soak must stay under --rss-slack MiB.

Exit status 0 when nothing is lost, nothing leaks and the RSS bound holds."""

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_util import MetroServer, metrics, read_headers, iter_chunks, request  # noqa: E402

TENANTS = {
    # key: (tenant, class, share of traffic)
    "sk-soak-standard-000000": ("team-chat", "standard", 0.40),
    "sk-soak-batch-000000000": ("nightly", "batch", 0.30),
    "sk-soak-realtime-000000": ("voice", "realtime", 0.20),
    "sk-soak-capped-00000000": ("capped", "standard", 0.10),
}
KEY_FILE = """# soak tenants
sk-soak-standard-000000 team-chat class=standard
sk-soak-batch-000000000 nightly class=batch
sk-soak-realtime-000000 voice class=realtime concurrency=16
sk-soak-capped-00000000 capped concurrency=2 tpm=20000 burst=4000
"""
SYSTEM = ("You are a careful assistant for a railway company. Answer briefly, cite the timetable "
          "when you can, and never invent a train that does not run. ") * 3
TOPICS = ["the night train to Vienna", "a delayed connection", "bicycle spaces", "a lost ticket",
          "the coastal line", "seat reservations", "the dining car", "platform changes"]


# The server's objectives (--sla) and admission's factors, as the soak starts it. A request
# admitted in class c is promised its first token within SHED_AFTER x TTFT_MARGIN x ttft (the
# engine ends it with deadline_missed otherwise) and output at TTFT_MARGIN x tpot per token
# (admission takes no more into a class whose running requests are slower); a client of
# that class waits that long for max_tokens tokens, with SHED_AFTER's slack on the pace too.
SLA = {"realtime": (2.0, 0.1), "standard": (10.0, 0.2), "batch": (60.0, 1.0)}  # class: (ttft, tpot)
SLA_SPEC = "realtime:ttft=2,tpot=0.1 standard:ttft=10,tpot=0.2 batch:ttft=60,tpot=1"
TTFT_MARGIN, SHED_AFTER = 3.0, 1.5


def promise_s(sla_class, max_tokens):
    ttft, tpot = SLA[sla_class]
    return SHED_AFTER * TTFT_MARGIN * (ttft + max_tokens * tpot) + 30.0


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Outcome(Exception):
    """A request's bucket, raised from deep inside the exchange."""

    def __init__(self, bucket, detail=""):
        super().__init__(bucket)
        self.bucket, self.detail = bucket, detail


async def exchange(port, path, body_bytes, key, headers, on_event=None, progress=None):
    """One request on a fresh connection. Returns (status, header text, body bytes, events,
    hung_up). Streams (text/event-stream) are read event by event; on_event(payload) may
    return True to hang up. `progress` (a dict) records how far it got: 'headers', 'events'."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write((f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                      f"Authorization: Bearer {key}\r\n{extra}Content-Length: {len(body_bytes)}\r\n\r\n").encode()
                     + body_bytes)
        await writer.drain()
        status, head = await read_headers(reader)
        if progress is not None:
            progress["headers"] = status
        events = []
        if "text/event-stream" in head:
            buf = b""
            async for chunk in iter_chunks(reader):
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if not ev.startswith(b"data: "):
                        raise Outcome("lost", f"not an SSE event: {ev[:80]!r}")
                    payload = ev[6:].decode()
                    events.append(payload)
                    if progress is not None:
                        progress["events"] = len(events)
                    if on_event and on_event(payload):
                        return status, head, b"", events, True
            return status, head, b"", events, False
        if "transfer-encoding: chunked" in head:
            data = b"".join([c async for c in iter_chunks(reader)])
        else:
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            data = await reader.readexactly(length)
        return status, head, data, events, False
    finally:
        writer.close()


def pick_request(rng, model, misbehave):
    """(kind, path, body dict or raw bytes, headers, on_event factory or None, early_abort_s)."""
    kind = rng.choices(
        ["chat_stream", "chat", "completion", "completion_stream", "n2", "logprobs", "embeddings", "malformed",
         "disconnect", "early_abort"],
        weights=[25, 10, 15, 15, 5, 5, 8, 3, 9, 5] if misbehave else [30, 15, 20, 20, 5, 5, 5, 0, 0, 0])[0]
    topic = rng.choice(TOPICS)
    max_tokens = rng.choice([4, 8, 16, 32, 64, 96])
    headers = {}
    if rng.random() < 0.05:
        headers["X-Metro-Deadline-Ms"] = str(rng.choice([200, 2000, 20000]))
    chat = {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Tell me about {topic}. ({rng.randrange(10**6)})"}]}
    completion = {"model": model, "max_tokens": max_tokens,
                  "prompt": f"{SYSTEM}\nQuestion {rng.randrange(10**6)} about {topic}:"}
    if kind == "chat_stream":
        return kind, "/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True}), headers, None, None
    if kind == "chat":
        return kind, "/v1/chat/completions", chat, headers, None, None
    if kind == "completion":
        return kind, "/v1/completions", completion, headers, None, None
    if kind == "completion_stream":
        return kind, "/v1/completions", dict(completion, stream=True, ignore_eos=rng.random() < 0.5), headers, None, None
    if kind == "n2":
        return kind, "/v1/completions", dict(completion, n=2, temperature=0.8, seed=rng.randrange(1000)), headers, None, None
    if kind == "logprobs":
        return kind, "/v1/completions", dict(completion, logprobs=3), headers, None, None
    if kind == "embeddings":
        return kind, "/v1/embeddings", {"model": model, "input": [f"{topic} {rng.randrange(10**6)}", topic]}, headers, None, None
    if kind == "malformed":
        bad = rng.choice([b'{"model": "x", "prompt": ', b'{"model": 5, "prompt": "hi"}',
                          json.dumps({"model": model, "prompt": "hi", "max_tokens": -3}).encode(),
                          json.dumps({"model": model, "messages": "not a list"}).encode()])
        path = "/v1/chat/completions" if b"messages" in bad else "/v1/completions"
        return kind, path, bad, headers, None, None
    if kind == "disconnect":
        def factory():
            left = [rng.randint(1, 4)]

            def on_event(_payload):
                left[0] -= 1
                return left[0] <= 0
            return on_event
        return kind, "/v1/chat/completions", dict(chat, stream=True, max_tokens=96), headers, factory, None
    # early_abort: hang up after a short while, queued or not.
    return kind, "/v1/completions", dict(completion, stream=rng.random() < 0.5), headers, None, rng.uniform(0.0, 0.5)


def judge(kind, status, head, data, events, hung, body):
    """The bucket of a finished exchange."""
    if kind == "malformed" and status == 400:
        return "rejected_as_expected", ""
    if status in (429, 503):  # a tenant's concurrency is decided before its body is read
        try:
            err = json.loads(data)["error"]
            assert err["code"] and err["message"]
        except Exception:  # noqa: BLE001 - any shape problem is a finding
            return "lost", f"{status} without an error body: {data[:200]!r}"
        # Accepted, then ended unstarted past admission's promise: answered, and counted apart.
        if err["code"] == "deadline_missed":
            return "shed", ""
        return "refused", f"{status} {err['code']}"
    if status != 200 or kind == "malformed":
        return "lost", f"{kind} answered {status}: {data[:300]!r}"
    if kind == "disconnect":
        if hung:
            return "aborted", ""
    if events:
        if events[-1] != "[DONE]":
            return "lost", f"stream ended without [DONE]: {events[-2:]}"
        chunks = [json.loads(e) for e in events[:-1]]
        errors = [c for c in chunks if "error" in c]
        if errors and all(c["error"].get("code") == "deadline_missed" for c in errors):
            return "shed", ""  # begun, then paused past its bound: ended with an explicit error
        if errors:
            return "lost", f"error event in a stream: {errors[0]}"
        finishes = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
        if not finishes or any(f not in ("stop", "length") for f in finishes):
            return "lost", f"stream finish reasons {finishes}"
        return "ok", ""
    try:
        j = json.loads(data)
    except ValueError:
        return "lost", f"200 with a body that is not JSON: {data[:200]!r}"
    if kind == "embeddings":
        vecs = [d["embedding"] for d in j.get("data", [])]
        if len(vecs) != 2 or not all(v and all(math.isfinite(x) for x in v) for v in vecs):
            return "lost", "embeddings malformed"
        return "ok", ""
    choices = j.get("choices", [])
    want = body.get("n", 1) if isinstance(body, dict) else 1
    if len(choices) != want or any(c.get("finish_reason") not in ("stop", "length") for c in choices):
        return "lost", f"choices {choices[:2]}"
    used = j.get("usage", {}).get("completion_tokens", -1)
    if not 0 <= used <= want * body["max_tokens"]:
        return "lost", f"usage {j.get('usage')}"
    return "ok", ""


class Tally:
    def __init__(self, patience_floor=300.0):
        self.buckets, self.kinds, self.refusals, self.lost, self.lost_causes = {}, {}, {}, [], {}
        self.latencies = []
        self.latencies_by_class = {}
        # ok answers that took longer than --patience (their class promised that much)
        self.patience_floor, self.ok_past_floor = patience_floor, 0

    def add(self, kind, bucket, detail, latency, sla_class=None):
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1
        self.kinds.setdefault(kind, {}).setdefault(bucket, 0)
        self.kinds[kind][bucket] += 1
        if bucket == "refused":
            self.refusals[detail] = self.refusals.get(detail, 0) + 1
        if bucket == "lost":
            if len(self.lost) < 50:
                self.lost.append((kind, detail))
            # Lost requests by cause, the variable parts (counts) left out.
            cause = detail.split(";")[0]
            self.lost_causes[cause] = self.lost_causes.get(cause, 0) + 1
        if bucket == "ok":
            self.latencies.append(latency)
            if sla_class is not None:
                self.latencies_by_class.setdefault(sla_class, []).append(latency)
            if latency > self.patience_floor:
                self.ok_past_floor += 1


async def one_request(port, model, rng, tally, patience, misbehave):
    key = rng.choices(list(TENANTS), weights=[v[2] for v in TENANTS.values()])[0]
    kind, path, body, headers, factory, early = pick_request(rng, model, misbehave)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    max_tokens = body.get("max_tokens", 0) if isinstance(body, dict) else 0
    patience = max(patience, promise_s(TENANTS[key][1], max_tokens))
    t0 = time.time()
    progress = {}
    coro = exchange(port, path, raw, key, headers, factory() if factory else None, progress)
    try:
        if early is not None:
            try:
                status, head, data, events, hung = await asyncio.wait_for(coro, timeout=early)
            except asyncio.TimeoutError:
                tally.add(kind, "aborted", "", 0)
                return
        else:
            status, head, data, events, hung = await asyncio.wait_for(coro, timeout=patience)
    except asyncio.TimeoutError:
        # Who and how far: the tenant (its class), the status if headers came, events seen.
        got = (f"status {progress['headers']}, {progress.get('events', 0)} events" if "headers" in progress
               else "no response headers")
        tally.add(kind, "lost", f"no answer in {patience} s ({TENANTS[key][0]}/{TENANTS[key][1]}; {got})", 0)
        return
    except Outcome as o:
        tally.add(kind, o.bucket, o.detail, 0)
        return
    except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError) as e:
        tally.add(kind, "lost", f"{type(e).__name__}: {e}", 0)
        return
    bucket, detail = judge(kind, status, head, data, events, hung, body)
    tally.add(kind, bucket, detail, time.time() - t0, TENANTS[key][1])


async def calibrate(port, model, seconds, workers, patience):
    tally = Tally()
    rng = random.Random(1)
    stop = time.time() + seconds

    async def worker():
        while time.time() < stop:
            await one_request(port, model, rng, tally, patience, misbehave=False)

    t0 = time.time()
    await asyncio.gather(*(worker() for _ in range(workers)))
    took = time.time() - t0
    return tally.buckets.get("ok", 0) / took, tally


async def soak(port, model, rate, seconds, patience, server_pid, rss_samples, health, max_outstanding):
    tally = Tally(patience)
    rng = random.Random(2)
    tasks = set()
    skipped = 0
    t_end = time.time() + seconds
    next_probe = time.time()

    async def probe():
        t0 = time.time()
        try:
            status, _, _ = await asyncio.to_thread(request, port, "GET", "/health", None, None, 10)
        except OSError:
            status = None
        health.append((time.time() - t0, status))
        rss_samples.append((time.time(), rss_mib(server_pid)))

    while time.time() < t_end:
        await asyncio.sleep(rng.expovariate(rate))
        if time.time() >= next_probe:
            next_probe += 10
            tasks.add(asyncio.ensure_future(probe()))
        if len(tasks) >= max_outstanding:
            skipped += 1  # the client side is saturated: not sent, not counted
            continue
        task = asyncio.ensure_future(one_request(port, model, rng, tally, patience, misbehave=True))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return tally, skipped


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metro", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--calibrate", type=float, default=60)
    ap.add_argument("--load", type=float, default=2.0, help="offered load as a multiple of the calibrated capacity")
    ap.add_argument("--patience", type=float, default=300, help="seconds a client waits for its whole answer")
    ap.add_argument("--rss-slack", type=float, default=64, help="MiB the RSS may grow over the second half")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seqs", type=int, default=32)
    ap.add_argument("--report", default="")
    args = ap.parse_args()

    model_name = "soak-model"
    with tempfile.TemporaryDirectory() as tmp:
        keys = os.path.join(tmp, "keys.txt")
        with open(keys, "w") as f:
            f.write(KEY_FILE)
        srv = MetroServer(args.metro, args.model, [
            "--model-name", model_name, "--api-key-file", keys, "--ctx", "1024", "--max-seqs", str(args.max_seqs),
            "-t", str(args.threads), "--admission", "on", "--drain-timeout", "30",
            "--sla", SLA_SPEC, "--ttft-margin", str(TTFT_MARGIN), "--shed-after", str(SHED_AFTER)])
        srv.start()
        srv.wait_ready()
        pid = srv.proc.pid
        report = {"command": " ".join(sys.argv), "server": " ".join(srv.cmd)}
        try:
            capacity, cal = asyncio.run(calibrate(srv.port, model_name, args.calibrate, args.max_seqs, args.patience))
            rate = max(0.5, capacity * args.load)
            print(f"calibration: {capacity:.2f} requests/s completed with {args.max_seqs} closed-loop clients "
                  f"({cal.buckets}); soak at {rate:.2f} requests/s for {args.duration:.0f} s", flush=True)
            rss_samples, health = [(time.time(), rss_mib(pid))], []
            t0 = time.time()
            tally, skipped = asyncio.run(soak(srv.port, model_name, rate, args.duration, args.patience, pid,
                                              rss_samples, health, max_outstanding=4000))
            soak_s = time.time() - t0
            # Settle: in flight 0, then the engine's gauges (published per step) at 0.
            deadline = time.time() + 300
            while metrics(srv.port)["metro_inflight_requests"] > 0 and time.time() < deadline:
                time.sleep(0.5)
            settled = None
            for _ in range(60):
                st, _, _ = request(srv.port, "POST", "/v1/completions",
                                   {"model": model_name, "prompt": "Hello", "max_tokens": 2},
                                   {"Authorization": "Bearer sk-soak-standard-000000"})
                m = metrics(srv.port)
                settled = {k: m.get(k) for k in ("metro_inflight_requests", "metro_requests_running",
                                                   "metro_requests_waiting", "metro_kv_blocks_used")}
                if st == 200 and all(v == 0 for v in settled.values()):
                    break
                time.sleep(0.5)
            m = metrics(srv.port)
            srv.signal(signal.SIGTERM)
            code = srv.wait_exit(timeout=90)
        finally:
            srv.kill()

    rss = [r for _, r in rss_samples if r is not None]
    half = len(rss) // 2
    first_half_max = max(rss[:half] or rss)
    second_half_max = max(rss[half:] or rss)
    growth = second_half_max - first_half_max
    health_lat = [d for d, s in health if s == 200]
    health_bad = sum(1 for _, s in health if s != 200)
    total = sum(tally.buckets.values())
    lost = tally.buckets.get("lost", 0)
    leaks = {k: v for k, v in (settled or {}).items() if v != 0}
    report.update({
        "capacity_rps": round(capacity, 3), "offered_rps": round(rate, 3), "soak_s": round(soak_s, 1),
        "requests": total, "buckets": tally.buckets, "by_kind": tally.kinds, "refusals": tally.refusals,
        "not_sent_client_saturated": skipped, "lost_by_cause": tally.lost_causes, "lost_samples": tally.lost,
        "ok_latency_s": {"p50": percentile(tally.latencies, 0.5), "p99": percentile(tally.latencies, 0.99)},
        "ok_latency_s_by_class": {c: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": max(v)}
                                  for c, v in tally.latencies_by_class.items()},
        "ok_past_patience_floor": tally.ok_past_floor,
        "patience_s_by_class_at_96_tokens": {c: max(args.patience, promise_s(c, 96)) for c in SLA},
        "health_probes": len(health), "health_not_200": health_bad,
        "health_latency_s_max": max(health_lat) if health_lat else None,
        "rss_mib": {"start": rss[0] if rss else None, "first_half_max": first_half_max,
                    "second_half_max": second_half_max, "end": rss[-1] if rss else None, "growth_second_half": growth},
        "after": settled, "generation_tokens": m.get("metro_generation_tokens_total"),
        "client_disconnects": m.get("metro_client_disconnects_total"), "sigterm_exit": code,
    })
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    failures = []
    if lost:
        failures.append(f"{lost} requests lost")
    if leaks or settled is None:
        failures.append(f"did not settle: {settled}")
    if growth > args.rss_slack:
        failures.append(f"RSS grew {growth:.1f} MiB over the second half (slack {args.rss_slack} MiB)")
    if health_bad:
        failures.append(f"{health_bad} health probes failed")
    if code != 0:
        failures.append(f"SIGTERM exit {code}")
    print("SOAK " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
