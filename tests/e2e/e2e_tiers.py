"""Precision tiers through the API: a server with --tiers serves each tier's exact text (the
low tier derived at start-up equals the same format written by `metro quantize` and served
alone), names the tier in system_fingerprint (per streamed chunk and per body), honours
metro.tier, exposes the metro_precision_* series, and refuses bad tier flags before loading."""

import asyncio
import json
import os
import subprocess

from e2e_util import MetroServer, check_error, env_int, metrics, request, sse_request

ASK = "Name three rivers of Europe and one fact about each."


def _server(ctx, model, extra=()):
    srv = MetroServer(ctx.metro, model, [
        "--model-name", ctx.model_name, "--ctx", "1024", "--ctx-total", "8192", "--max-seqs", "16",
        "--admission", "off",  # admission is e2e_sla.py's subject; other tests share the CPU
        "-t", str(env_int("METRO_E2E_THREADS", 2))] + list(extra))
    srv.start()
    srv.wait_ready()
    return srv


def _chat(port, model, extra=None, stream=False):
    body = {"model": model, "messages": [{"role": "user", "content": ASK}], "max_tokens": 40, "temperature": 0}
    body.update(extra or {})
    if stream:
        body["stream"] = True
        status, events, _ = asyncio.run(sse_request(port, "/v1/chat/completions", body, "none"))
        assert status == 200 and events[-1] == "[DONE]", (status, events[-2:])
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        return text, {c["system_fingerprint"] for c in chunks}
    status, _, data = request(port, "POST", "/v1/chat/completions", body)
    assert status == 200, (status, data[:300])
    j = json.loads(data)
    return j["choices"][0]["message"]["content"], j["system_fingerprint"]


def t_tiers_serve_each_tier_exactly(ctx):
    low_file = os.path.join(ctx.tmp, "tier-low-q4_0.gguf")
    p = subprocess.run([ctx.metro, "quantize", ctx.model_path, low_file, "--type", "q4_0"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-300:]
    want = {}
    for name, path in (("high", ctx.model_path), ("low", low_file)):
        srv = _server(ctx, path)
        try:
            want[name], fp = _chat(srv.port, ctx.model_name)
            assert fp == "metro", fp
        finally:
            srv.kill()
    assert want["high"] != want["low"], "the two formats give the same text; the test cannot tell tiers apart"
    srv = _server(ctx, ctx.model_path, ["--tiers", "low=q4_0", "--tier-policy", "low", "--tier-shadow-every", "1",
                                            "--tier-batch-budget", "low_latency=0.75,normal=0.75"])
    try:
        assert srv.wait_line("precision tiers: high"), "".join(srv.lines[-5:])
        got, fp = _chat(srv.port, ctx.model_name)
        assert (got, fp) == (want["low"], "metro-low"), (got, fp)
        got, fps = _chat(srv.port, ctx.model_name, stream=True)
        assert got == want["low"] and fps == {"metro-low"}, (got, fps)
        got, fp = _chat(srv.port, ctx.model_name, {"metro": {"tier": "high"}})
        assert (got, fp) == (want["high"], "metro-high"), (got, fp)
        st, _, body = request(srv.port, "POST", "/v1/chat/completions",
                              {"model": ctx.model_name, "messages": [{"role": "user", "content": "hi"}],
                               "metro": {"tier": "medium"}})
        assert check_error(st, body, 400)["param"] == "metro.tier"
        m = metrics(srv.port)
        assert m['metro_precision_tier_active{tier="low"}'] == 1, {k: v for k, v in m.items() if "precision" in k}
        assert m['metro_precision_tier_active{tier="high"}'] == 0
        assert m['metro_precision_tier_bytes{tier="high"}'] > m['metro_precision_tier_bytes{tier="low"}'] > 0
        assert m['metro_precision_tier_tokens_total{tier="low"}'] > 0
        assert m['metro_precision_rollbacks_total{cause="shadow_kl"}'] == 0
        for name in ("metro_precision_switches_total", "metro_precision_shadow_kl",
                     "metro_precision_shadow_scored_total", "metro_precision_pressure"):
            assert name in m, name
        # Idle: the batch budget of the low-latency / normal rows, as configured (x0.75).
        assert m["metro_precision_step_scale"] == 0.75, m.get("metro_precision_step_scale")
        low_tokens = m['metro_precision_tier_tokens_total{tier="low"}']
        ctx.note(f"tiers: Q4_0 low tier derived at start-up, {low_tokens:.0f} tokens computed by it")
    finally:
        srv.kill()


def t_tiers_flags_refused(ctx):
    for args, want in ((["--tiers", "mid=q4_0"], "unknown tier 'mid'"),
                       (["--tiers", "low"], "--tiers takes high=SRC,low=SRC"),
                       (["--tiers", "high=model,low=model"], "the same model"),
                       (["--tiers", "low=q4_0,low=q8_0"], "given twice"),
                       (["--tiers", "low=q4_0", "--tier-policy", "sometimes"], "--tier-policy must be auto"),
                       (["--tiers", "low=q4_0", "--tier-batch-budget", "peak=2"], "--tier-batch-budget takes MODE=SCALE"),
                       (["--tiers", "low=q4_0", "--tier-batch-budget", "high_load=9"], "needs a scale in [0.25, 4]")):
        p = subprocess.run([ctx.metro, "serve", "-m", ctx.model_path, "--port", "0"] + args, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:])


TESTS = [t_tiers_serve_each_tier_exactly, t_tiers_flags_refused]
