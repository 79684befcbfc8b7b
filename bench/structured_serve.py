#!/usr/bin/env python3
"""Structured outputs end to end: output tokens/s with and without a JSON schema at several
concurrency levels, for `metro serve`, optionally for metro with `--no-jump-forward` and for
llama.cpp's `llama-server` (same GGUF, prompts and requests, one server at a time, in the
same run), and (with --llama-completion) llama.cpp's one-stream decode speed with and
without `--json-schema`.

    python3 bench/structured_serve.py [--levels 1,16] [--requests 32] [--jump-forward-off] \
        [--rounds N] [--llama-server PATH/llama-server] [--llama-completion PATH/llama-completion]

Chat requests at temperature 0, max_tokens 128, each level run with the schema and without,
alternated; tokens/s = completion tokens of all requests / wall time of the level. A
constrained output ends when its JSON is complete, so it has fewer tokens; the rate is what
compares. --rounds N runs the metro servers N times in turn (runs on this machine vary by
up to 20% from one server start to the next; the comparison within a run varies less).
llama-server gets 16 slots (-np 16, 1024 tokens of context each). llama-completion:
greedy, 128 tokens, its own "eval time" rate.
"""

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {"type": "object", "properties": {
    "name": {"const": "get_weather"},
    "arguments": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1}}, "required": ["location"]}},
    "required": ["name", "arguments"]}
ASKS = ["What's the weather in Paris for the next three days?", "Weather in Tokyo tomorrow, in fahrenheit.",
        "Is it going to rain in Lima this week?", "How cold will Oslo be on Friday?"]


async def post(port, body):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = json.dumps(body).encode()
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head[:200]
    return json.loads(payload)


async def level_run(port, streams, n, constrained):
    sem = asyncio.Semaphore(streams)
    tokens = 0

    async def one(i):
        nonlocal tokens
        body = {"messages": [{"role": "user", "content": ASKS[i % len(ASKS)] + " Answer as a get_weather call in JSON."}],
                "max_tokens": 128, "temperature": 0}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "call", "schema": SCHEMA}}
        async with sem:
            r = await post(port, body)
            tokens += r["usage"]["completion_tokens"]

    t0 = time.time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return tokens / (time.time() - t0)


def llama_rate(binary, model, schema):
    prompt = ("<|im_start|>user\n" + ASKS[0] + " Answer as a get_weather call in JSON.<|im_end|>\n"
              "<|im_start|>assistant\n")
    cmd = [binary, "-m", model, "-p", prompt, "-n", "128", "--temp", "0", "-t", "2", "-no-cnv"]
    if schema:
        cmd += ["--json-schema", json.dumps(SCHEMA)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"eval time =.*?([\d.]+) tokens per second", p.stderr.split("prompt eval time")[-1])
    return float(m.group(1)) if m else float("nan")


def wait_ready(port, path):
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    raise RuntimeError(f"server on port {port} did not become ready")


def run_server(label, cmd, port, ready_path, levels, requests):
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, ready_path)
        asyncio.run(level_run(port, 1, 4, True))  # compile the schema, warm caches
        for streams in levels:
            free = asyncio.run(level_run(port, streams, requests, False))
            json_rate = asyncio.run(level_run(port, streams, requests, True))
            print(f"{label:28s} streams {streams:3d}: free {free:7.1f} tok/s, json_schema {json_rate:7.1f} tok/s "
                  f"({100 * (json_rate / free - 1):+.1f}%)", flush=True)
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metro", default=os.path.join(ROOT, "build/bin/metro"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--port", type=int, default=18290)
    ap.add_argument("--jump-forward-off", action="store_true", help="also run metro with --no-jump-forward")
    ap.add_argument("--rounds", type=int, default=1, help="run the metro servers this many times in turn")
    ap.add_argument("--llama-server", default="")
    ap.add_argument("--llama-completion", default="")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    metro = [a.metro, "serve", "-m", a.model, "-t", "2", "--max-seqs", "64", "--admission", "off"]
    runs = [("metro serve", metro)]
    if a.jump_forward_off:
        runs.append(("metro serve --no-jump-forward", metro + ["--no-jump-forward"]))
    for r in range(a.rounds):
        for i, (label, cmd) in enumerate(runs):
            port = a.port + i + r * len(runs)
            run_server(label, cmd + ["--port", str(port)], port, "/ready", levels, a.requests)
    if a.llama_server:
        port = a.port + len(runs) * a.rounds
        run_server("llama-server", [a.llama_server, "-m", a.model, "--port", str(port), "-t", "2", "-np", "16",
                                    "-c", "16384"], port, "/health", levels, a.requests)
    if a.llama_completion:
        free = llama_rate(a.llama_completion, a.model, False)
        constrained = llama_rate(a.llama_completion, a.model, True)
        print(f"{'llama-completion':28s} streams   1: free {free:7.1f} tok/s, json_schema {constrained:7.1f} tok/s "
              f"({100 * (constrained / free - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
