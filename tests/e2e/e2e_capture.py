"""Teacher capture on live servers: the dataset `--capture-teacher` writes, read back with
the documented reader (scripts/teacher_capture.py), holds what the server answered."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

from e2e_util import MetroServer, env_int, metrics, promtool, request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import teacher_capture  # noqa: E402


def capture_server(ctx, out_dir, extra):
    return MetroServer(ctx.metro, ctx.model_path, ["--model-name", "m", "--capture-teacher", out_dir,
                                                   "--capture-top-k", "5", "--ctx", "512", "--ctx-total", "2048",
                                                   "--admission", "off",  # e2e_sla.py's subject
                                                   "-t", str(env_int("METRO_E2E_THREADS", 2))] + extra)


def post(port, path, body, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    st, _, data = request(port, "POST", path, body, headers)
    assert st == 200, (path, st, data[:300])
    return data


def wait_samples(port, n):
    deadline = time.time() + 20
    got = None
    while time.time() < deadline:
        got = metrics(port).get("metro_teacher_capture_samples_total", 0)
        if got >= n:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{got} samples captured, want {n}")


def t_teacher_capture_dataset(ctx):
    """--capture-teacher: a greedy completion that asked for 2 alternatives (the capture keeps
    5; the response still shows 2), a sampled chat request with n=2 and no logprobs (none in
    the response), a streamed completion: 4 samples whose ids, prompts (== /tokenize), outputs
    (== the response's text and tokens), chosen log-probabilities (== the response's) and
    top-5 (best first, the greedy token first, a distribution's mass at most 1) hold. With
    an API-key file only tenants with capture=R are captured; none opting in is refused."""
    out = tempfile.mkdtemp(prefix="metro-capture-")
    srv = capture_server(ctx, out, [])
    srv.start()
    try:
        srv.wait_ready()
        prompt = "The capital of France is"
        a = json.loads(post(srv.port, "/v1/completions",
                            {"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2,
                             "ignore_eos": True}))
        lp = a["choices"][0]["logprobs"]
        assert all(2 <= len(t) <= 3 for t in lp["top_logprobs"]), lp["top_logprobs"]
        b = json.loads(post(srv.port, "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "Name a colour."}], "n": 2,
                             "max_tokens": 5, "temperature": 0.8, "seed": 3}))
        assert all(c.get("logprobs") is None for c in b["choices"]), b["choices"]
        stream = post(srv.port, "/v1/completions", {"model": "m", "prompt": "One, two,", "max_tokens": 4,
                                                     "temperature": 0, "stream": True, "ignore_eos": True})
        chunks = [json.loads(x[6:]) for x in stream.decode().split("\n") if x.startswith("data: {")]
        stream_id = chunks[0]["id"]
        wait_samples(srv.port, 4)  # counted once written and flushed
        promtool("check", "metrics", stdin=request(srv.port, "GET", "/metrics")[2])
        samples = list(teacher_capture.samples(out))
        assert len(samples) == 4, [(s["id"], s["choice"]) for s in samples]
        by_id = {}
        for s in samples:
            by_id.setdefault(s["id"], []).append(s)
            assert s["model"] == "m" and s["variant"] == "" and s["top_k"] == 5, s
            assert s["n_output"] == len(s["output"]) > 0 and s["finish_reason"] in ("length", "stop"), s
            for row_ids, row in zip(s["top_ids"], s["top_logprobs"]):
                assert all(x >= y for x, y in zip(row, row[1:])), row  # best first
                assert sum(math.exp(x) for x in row) <= 1.0 + 1e-4, row
                assert len(set(row_ids)) == len(row_ids) and min(row_ids) >= 0, row_ids
        sa = by_id[a["id"]][0]
        toks = json.loads(post(srv.port, "/tokenize", {"model": "m", "prompt": prompt}))["tokens"]
        assert sa["prompt"] == toks, (sa["prompt"], toks)
        text = json.loads(post(srv.port, "/detokenize", {"model": "m", "tokens": sa["output"]}))["prompt"]
        assert text == a["choices"][0]["text"], (text, a["choices"][0]["text"])
        assert sa["endpoint"] == "/v1/completions" and sa["request_id"].startswith("req_"), sa
        assert sa["n_output"] == a["usage"]["completion_tokens"] == 6, sa["n_output"]
        for i in range(sa["n_output"]):
            assert sa["top_ids"][i][0] == sa["output"][i], (i, sa["top_ids"][i], sa["output"][i])  # greedy: argmax
            assert sa["top_logprobs"][i][0] == sa["output_logprob"][i], i
            assert abs(sa["output_logprob"][i] - lp["token_logprobs"][i]) < 1e-4, (i, sa["output_logprob"][i], lp)
        assert sorted(s["choice"] for s in by_id[b["id"]]) == [0, 1], by_id[b["id"]]
        assert sum(s["n_output"] for s in by_id[b["id"]]) == b["usage"]["completion_tokens"], b["usage"]
        assert len(by_id[stream_id]) == 1 and by_id[stream_id][0]["n_output"] == 4, by_id.get(stream_id)
    finally:
        srv.kill()
    summary = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "teacher_capture.py"), out],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and summary.stdout.startswith("4 samples, "), (summary.stdout, summary.stderr)
    ctx.note("teacher capture: " + summary.stdout.strip())
    shutil.rmtree(out)

    # Opt-in per tenant.
    out = tempfile.mkdtemp(prefix="metro-capture-")
    keys = os.path.join(out, "keys")
    with open(keys, "w") as f:
        f.write("sk-capture-aaaa team-a capture=1\nsk-capture-bbbb team-b\n")
    data_dir = os.path.join(out, "data")
    srv = capture_server(ctx, data_dir, ["--api-key-file", keys])
    srv.start()
    try:
        srv.wait_ready()
        for key in ("sk-capture-bbbb", "sk-capture-aaaa", "sk-capture-bbbb"):
            post(srv.port, "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2}, key=key)
        wait_samples(srv.port, 1)
        time.sleep(0.5)
        got = [s["tenant"] for s in teacher_capture.samples(data_dir)]
        assert got == ["team-a"], got
    finally:
        srv.kill()
    with open(keys, "w") as f:
        f.write("sk-capture-aaaa team-a\n")
    p = subprocess.run([ctx.metro, "serve", "-m", ctx.model_path, "--port", "0", "--api-key-file", keys,
                        "--capture-teacher", data_dir], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "capture=R" in p.stderr, (p.returncode, p.stderr[-300:])
    shutil.rmtree(out)


TESTS = [t_teacher_capture_dataset]
