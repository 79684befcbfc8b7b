"""Speculative decoding through the API: a server with --spec ngram gives the same greedy
text as one without, reports prediction tokens in the usage, counts drafts on /metrics,
honours metro.speculative=false, and refuses a malformed prediction; --spec draft and
--spec self give the same text too, and bad flags are refused before the model loads."""

import asyncio
import json
import subprocess

from e2e_util import MetroServer, check_error, env_int, metrics, request, sse_request

TEXT = ("The night train leaves the central station at ten in the evening. It stops in three cities "
        "before it reaches the coast, and passengers can sleep while it crosses the mountains.")
ASK = "Copy this paragraph exactly, word for word:\n\n" + TEXT


def _server(ctx, spec, extra=()):
    srv = MetroServer(ctx.metro, ctx.model_path, [
        "--model-name", ctx.model_name, "--ctx", "1024", "--ctx-total", "8192", "--max-seqs", "16",
        "--admission", "off",  # admission is e2e_sla.py's subject; other tests share the CPU
        "--spec", spec, "--spec-max-k", "8", "-t", str(env_int("METRO_E2E_THREADS", 2))] + list(extra))
    srv.start()
    srv.wait_ready()
    return srv


def _chat(port, model, extra, stream=False):
    body = {"model": model, "messages": [{"role": "user", "content": ASK}], "max_tokens": 64, "temperature": 0}
    body.update(extra)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        status, events, _ = asyncio.run(sse_request(port, "/v1/chat/completions", body, "none"))
        assert status == 200 and events[-1] == "[DONE]", (status, events[-2:])
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        usage = [c["usage"] for c in chunks if c.get("usage")][-1]
        return text, usage
    status, _, data = request(port, "POST", "/v1/chat/completions", body)
    assert status == 200, (status, data[:300])
    j = json.loads(data)
    return j["choices"][0]["message"]["content"], j["usage"]


def t_spec_same_text_and_prediction_usage(ctx):
    plain = _server(ctx, "off")
    try:
        want, usage = _chat(plain.port, ctx.model_name, {})
        assert usage["completion_tokens_details"]["accepted_prediction_tokens"] == 0, usage
    finally:
        plain.kill()
    srv = _server(ctx, "ngram")
    try:
        got, _ = _chat(srv.port, ctx.model_name, {})
        assert got == want, (got, want)
        # The answer itself as the prediction, with a word changed: most of it is accepted.
        pred = want.replace("three", "four", 1)
        got, usage = _chat(srv.port, ctx.model_name, {"prediction": {"type": "content", "content": pred}})
        assert got == want, (got, want)
        details = usage["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] >= usage["completion_tokens"] // 2, usage
        got, usage = _chat(srv.port, ctx.model_name,
                           {"prediction": {"type": "content", "content": [{"type": "text", "text": pred}]}},
                           stream=True)
        assert got == want and usage["completion_tokens_details"]["accepted_prediction_tokens"] > 0, usage
        m = metrics(srv.port)
        prop = {k: v for k, v in m.items() if k.startswith("metro_spec_proposed_tokens_total")}
        assert any('proposer="prediction"' in k and v > 0 for k, v in prop.items()), prop
        assert any(k.startswith("metro_spec_steps_total") and 'k="0"' in k for k in m), "no k=0 series"
        # Turned off per request: no drafts verified for it.
        before = m["metro_spec_draft_tokens_total"]
        got, usage = _chat(srv.port, ctx.model_name, {"prediction": {"type": "content", "content": pred},
                                                      "metro": {"speculative": False}})
        assert got == want and usage["completion_tokens_details"]["accepted_prediction_tokens"] == 0, usage
        assert metrics(srv.port)["metro_spec_draft_tokens_total"] == before
        # Malformed predictions are 400 naming the field.
        for bad in ({"type": "text", "content": "x"}, {"type": "content", "content": 5}, "just text",
                    {"type": "content", "content": [{"type": "image", "url": "x"}]}):
            st, _, body = request(srv.port, "POST", "/v1/chat/completions",
                                  {"model": ctx.model_name, "messages": [{"role": "user", "content": "hi"}],
                                   "prediction": bad})
            err = check_error(st, body, 400)
            assert err["param"].startswith("prediction"), err
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              {"model": ctx.model_name, "prompt": "hi", "metro": {"speculative": "no"}})
        check_error(st, body, 400)
        ctx.note(f"speculation: {usage['completion_tokens']} tokens; prediction accepted "
                 f"{details['accepted_prediction_tokens']}, rejected {details['rejected_prediction_tokens']}")
    finally:
        srv.kill()


def t_spec_draft_model_and_self(ctx):
    plain = _server(ctx, "off")
    try:
        want, _ = _chat(plain.port, ctx.model_name, {})
    finally:
        plain.kill()
    # The model as its own draft model (the same vocabulary, trivially), then itself with
    # layers skipped: the text is the model's either way, and the drafts are counted under
    # their proposer. The controller finds neither worth its cost on this model, so every
    # proposed token is verified (--spec-no-controller); with it on, the text is the same.
    for spec, extra, label in (("draft", ["--spec-draft", ctx.model_path, "--spec-no-controller"], "draft"),
                               ("self", ["--spec-self-skip", "25-29", "--spec-no-controller"], "self"),
                               ("self", [], None)):
        srv = _server(ctx, spec, extra)
        try:
            got, _ = _chat(srv.port, ctx.model_name, {})
            assert got == want, (spec, got, want)
            got, _ = _chat(srv.port, ctx.model_name, {}, stream=True)
            assert got == want, (spec, got, want)
            if label is None:
                continue
            m = metrics(srv.port)
            key = [k for k in m if k.startswith("metro_spec_proposed_tokens_total") and f'proposer="{label}"' in k]
            assert key and m[key[0]] > 0, (spec, {k: v for k, v in m.items() if "spec_proposed" in k})
            ctx.note(f"--spec {spec}: {m[key[0]]:.0f} draft tokens verified")
        finally:
            srv.kill()


def t_spec_flags_refused(ctx):
    for args, want in ((["--spec", "bogus"], "--spec must be off, ngram, draft or self"),
                       (["--spec", "draft"], "--spec draft needs --spec-draft FILE"),
                       (["--spec", "draft", "--spec-draft", "/nonexistent.gguf"], "--spec-draft"),
                       (["--spec", "self", "--spec-self-skip", "3-1"], "bad layer range"),
                       (["--spec", "self", "--spec-self-skip", "0-99"], "outside"),
                       (["--spec-self-skip", "3"], "--spec-self-skip needs --spec self"),
                       (["--spec-draft", "x.gguf"], "--spec-draft needs --spec draft")):
        p = subprocess.run([ctx.metro, "serve", "-m", ctx.model_path, "--port", "0"] + args, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:])


TESTS = [t_spec_same_text_and_prediction_usage, t_spec_draft_model_and_self, t_spec_flags_refused]
