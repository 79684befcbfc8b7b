#!/usr/bin/env python3
"""What the HTTP layer adds per streamed token: a client's time per output token (TPOT)
against the engine's own step time over the same requests (from /metrics).

    build/e2e-venv/bin/python tests/e2e/bench_stream_latency.py --url http://127.0.0.1:8080 \
        [--tokens 64] [--runs 5] [--api-key KEY]

One stream at a time, so each engine step computes exactly that stream's next token: the
difference between the client's inter-token interval and the mean step duration is what
happens between the engine's push and the client's read (notify, I/O thread, JSON + SSE
framing, socket, client parsing). Prints the median and the spread over runs.
"""

import argparse
import http.client
import json
import re
import statistics
import time
import urllib.parse


def scrape(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
            # The engine's series carry a `model` label; one model is served here.
            bare = re.sub(r'\{model="[^"]*"\}$', "", name)
            if bare != name:
                out[bare] = float(value)
    return out


def one_stream(host, port, tokens, key, on_first=None):
    body = json.dumps({"prompt": "Tell me about trains.", "max_tokens": tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    arrivals = []
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            data = ev[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j["choices"] and j["choices"][0]["text"]:
                arrivals.append(now)
                if len(arrivals) == 1 and on_first:
                    on_first()
    conn.close()
    return arrivals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--api-key", default="")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80
    one_stream(host, port, 4, args.api_key)  # warm up
    rows = []
    for _ in range(args.runs):
        # The window starts after the first token, so the prompt's (longer) step is not in it;
        # the chunks that queued up while /metrics was read are skipped too.
        box = {}
        arrivals = one_stream(host, port, args.tokens, args.api_key,
                              on_first=lambda: box.update(m0=scrape(host, port), t0=time.perf_counter()))
        m1 = scrape(host, port)
        m0 = box["m0"]
        later = [a for a in arrivals if a > box["t0"]][2:]
        steps = m1["metro_engine_step_duration_seconds_count"] - m0["metro_engine_step_duration_seconds_count"]
        step_s = (m1["metro_engine_step_duration_seconds_sum"] - m0["metro_engine_step_duration_seconds_sum"]) / steps
        tpot = (later[-1] - later[0]) / (len(later) - 1)
        rows.append((tpot * 1e3, step_s * 1e3, (tpot - step_s) * 1e3))
        print(f"client TPOT {tpot * 1e3:8.2f} ms | engine step {step_s * 1e3:8.2f} ms | "
              f"added {1e3 * (tpot - step_s):6.3f} ms per token ({len(later)} chunks, {int(steps)} steps)")
    added = [r[2] for r in rows]
    print(f"HTTP layer added per streamed token: median {statistics.median(added):.3f} ms "
          f"(min {min(added):.3f}, max {max(added):.3f}) over {len(rows)} runs of {args.tokens} tokens; "
          f"median TPOT {statistics.median(r[0] for r in rows):.2f} ms, "
          f"median step {statistics.median(r[1] for r in rows):.2f} ms")


if __name__ == "__main__":
    main()
