"""OpenAI API behaviour of metro serve, checked with the official openai client."""

import base64
import json
import math
import os
import struct
import time

import openai

import subprocess

from e2e_util import MetroServer, env_int, metrics, promtool, request


def t_models(t):
    ids = [m.id for m in t.client.models.list().data]
    assert ids == [t.model_name], ids
    m = t.client.models.retrieve(t.model_name)
    assert m.id == t.model_name and m.object == "model" and m.owned_by == "metro", m
    try:
        t.client.models.retrieve("no-such-model")
        raise AssertionError("a model that is not served was found")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body


def t_chat(t):
    msgs = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]
    r = t.client.chat.completions.create(model=t.model_name, messages=msgs, max_tokens=8, temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    assert abs(r.created - time.time()) < 3600
    assert c.index == 0 and c.message.role == "assistant" and c.message.content, c
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert 0 < u.completion_tokens <= 8 and u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if c.finish_reason == "length":
        assert u.completion_tokens == 8
    chunks = list(t.client.chat.completions.create(model=t.model_name, messages=msgs, max_tokens=8, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content, (text, c.message.content)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [c.finish_reason], finishes
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == u.completion_tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def t_completions(t):
    kw = dict(model=t.model_name, prompt="The capital of France is", max_tokens=6, temperature=0)
    r = t.client.completions.create(**kw)
    assert r.object == "text_completion" and r.id.startswith("cmpl-"), r
    text = r.choices[0].text
    assert text, r
    stream = list(t.client.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == text
    assert stream[-1].choices[0].finish_reason == r.choices[0].finish_reason
    echo = t.client.completions.create(echo=True, **kw)
    assert echo.choices[0].text == "The capital of France is" + text, echo.choices[0].text


def t_n2(t):
    r = t.client.completions.create(model=t.model_name, prompt="Once upon a time", max_tokens=5, n=2,
                                    temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 10, r.usage
    chunks = list(t.client.chat.completions.create(model=t.model_name, n=2, max_tokens=4, temperature=1.0, seed=3,
                                                   messages=[{"role": "user", "content": "Name a colour."}],
                                                   stream=True))
    texts = {0: "", 1: ""}
    finished = set()
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and all(texts.values()), texts


def t_stop(t):
    kw = dict(model=t.model_name, prompt="List the days of the week: Monday,", temperature=0,
              extra_body={"ignore_eos": True})
    full = t.client.completions.create(max_tokens=16, **kw).choices[0].text
    # A stop string that first occurs a little way into the output.
    k = next((i for i in range(3, len(full) - 2) if full.find(full[i:i + 3]) == i and full[i:i + 3].strip()), None)
    assert k is not None, full
    stop = full[k:k + 3]
    r = t.client.completions.create(max_tokens=16, stop=[stop, "@@never@@"], **kw)
    assert r.choices[0].text == full[:k], (r.choices[0].text, full, stop)
    assert r.choices[0].finish_reason == "stop"
    one = t.client.completions.create(max_tokens=16, stop=stop, **kw)
    assert one.choices[0].text == full[:k]


def t_logprobs(t):
    r = t.client.completions.create(model=t.model_name, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4 == r.usage.completion_tokens
    assert all(x <= 0 for x in lp.token_logprobs)
    for chosen, lpv, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4, top
        assert max(top.values()) == lpv, (top, lpv)  # greedy picks the most likely token
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    c = t.client.chat.completions.create(model=t.model_name, messages=[{"role": "user", "content": "Count to 3"}],
                                         max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2 and e.logprob <= 0
        assert abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6, e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token


def t_seed(t):
    def gen(seed):
        return t.client.completions.create(model=t.model_name, prompt="My favourite animal is", max_tokens=8,
                                           temperature=1.0, seed=seed,
                                           extra_body={"ignore_eos": True}).choices[0].text
    a, b = gen(1234), gen(1234)
    assert a == b, (a, b)
    others = {gen(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, others


def t_usage(t):
    ids = t.token_ids("Hello world, this is a test.")
    r = t.client.completions.create(model=t.model_name, prompt=ids, max_tokens=5, n=2,
                                    extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids), (r.usage, len(ids))
    assert r.usage.completion_tokens == 10 and r.usage.total_tokens == len(ids) + 10, r.usage
    two = t.client.completions.create(model=t.model_name, prompt=[ids, ids[:3]], max_tokens=2,
                                      extra_body={"ignore_eos": True})
    assert two.usage.prompt_tokens == len(ids) + 3 and two.usage.completion_tokens == 4, two.usage
    assert [c.index for c in two.choices] == [0, 1]
    text = t.client.completions.create(model=t.model_name, prompt="Hello world, this is a test.", max_tokens=1)
    assert text.usage.prompt_tokens == len(t.token_ids("Hello world, this is a test.", special=True))


def t_prefix_cache(t):
    prompt = "Here is a long shared preamble that several requests start with. " * 4
    first = t.client.completions.create(model=t.model_name, prompt=prompt, max_tokens=1)
    second = t.client.completions.create(model=t.model_name, prompt=prompt, max_tokens=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 and cached < second.usage.prompt_tokens, (first.usage, second.usage)


def t_embeddings(t):
    r = t.client.embeddings.create(model=t.model_name, input=["hello world", "a different sentence"])
    assert len(r.data) == 2 and [d.index for d in r.data] == [0, 1]
    for d in r.data:
        assert len(d.embedding) == t.n_embd, len(d.embedding)
        norm = math.sqrt(sum(x * x for x in d.embedding))
        assert abs(norm - 1.0) < 1e-3, norm
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens
    assert r.data[0].embedding != r.data[1].embedding
    status, _, body = request(t.port, "POST", "/v1/embeddings", {"input": "hello world", "encoding_format": "float"},
                              t.auth)
    assert status == 200, body
    floats = json.loads(body)["data"][0]["embedding"]
    status, _, body = request(t.port, "POST", "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"},
                              t.auth)
    raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == len(floats) and max(abs(a - b) for a, b in zip(decoded, floats)) < 1e-6
    assert max(abs(a - b) for a, b in zip(floats, r.data[0].embedding)) < 1e-5


def t_unknown_model(t):
    for call in (lambda: t.client.chat.completions.create(model="gpt-unknown", max_tokens=1,
                                                          messages=[{"role": "user", "content": "hi"}]),
                 lambda: t.client.completions.create(model="gpt-unknown", prompt="hi", max_tokens=1),
                 lambda: t.client.embeddings.create(model="gpt-unknown", input="hi")):
        try:
            call()
            raise AssertionError("no error")
        except openai.NotFoundError as e:
            assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body


def t_invalid_utf8_output(t):
    # Force a lone lead byte (0xE2 starts a 3-byte character) as the only generated token.
    byte_id = t.token_ids(b"\xe2")
    assert len(byte_id) == 1, byte_id
    kw = dict(model=t.model_name, prompt="Say something:", max_tokens=1, temperature=0,
              logit_bias={str(byte_id[0]): 100})
    r = t.client.completions.create(**kw)
    assert r.choices[0].text == "\ufffd", repr(r.choices[0].text)
    s = "".join(ch.choices[0].text for ch in t.client.completions.create(stream=True, **kw) if ch.choices)
    assert s == "\ufffd", repr(s)


def t_tokenize_detokenize(t):
    """vLLM's /tokenize and /detokenize shapes (llama-server's names accepted), behind the keys."""
    st, _, body = request(t.port, "POST", "/tokenize", {"prompt": "Hello, world"}, t.auth)
    assert st == 200, body[:300]
    j = json.loads(body)
    assert j["count"] == len(j["tokens"]) > 0 and j["max_model_len"] > 0, j
    st, _, body = request(t.port, "POST", "/detokenize", {"tokens": j["tokens"]}, t.auth)
    assert st == 200 and json.loads(body)["prompt"] == "Hello, world", body[:300]
    # The prompt a chat request would send, as the completions endpoint would count it.
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    st, _, body = request(t.port, "POST", "/tokenize", {"model": t.model_name, "messages": msgs}, t.auth)
    assert st == 200, body[:300]
    n = json.loads(body)["count"]
    r = t.client.chat.completions.create(model=t.model_name, messages=msgs, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == n, (r.usage.prompt_tokens, n)
    st, _, body = request(t.port, "POST", "/tokenize", {"content": "Hello", "add_special": False}, t.auth)
    assert st == 200 and json.loads(body)["tokens"], body[:300]
    for path, bad, param in (("/tokenize", {"prompt": 5}, "prompt"), ("/detokenize", {"tokens": [-1]}, "tokens"),
                             ("/detokenize", {"tokens": "x"}, "tokens")):
        st, _, body = request(t.port, "POST", path, bad, t.auth)
        assert st == 400 and json.loads(body)["error"]["param"] == param, (path, st, body[:300])
    st, _, body = request(t.port, "POST", "/tokenize", {"prompt": "x"}, {})
    assert st == 401, st
    st, _, body = request(t.port, "GET", "/tokenize", None, t.auth)
    assert st == 405, st


def t_responses(t):
    """POST /v1/responses through the SDK: the same greedy text as the chat request it
    amounts to, the event stream the SDK reads, stored conversations continued with
    previous_response_id, retrieve and delete, tenants kept apart, structured output and the
    refusals."""
    c = t.client
    first = "What is the capital of France?"
    r = c.responses.create(model=t.model_name, instructions="Answer briefly.", input=first, max_output_tokens=16,
                           temperature=0, metadata={"run": "e2e"})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == t.model_name, r
    assert r.status in ("completed", "incomplete") and r.output_text, r
    assert r.instructions == "Answer briefly." and r.metadata == {"run": "e2e"} and r.store is True, r
    assert 0 < r.usage.output_tokens <= 16 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 16, r
    chat = c.chat.completions.create(model=t.model_name, max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": first}])
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat.choices[0].message.content)
    assert r.usage.input_tokens == chat.usage.prompt_tokens, (r.usage, chat.usage)

    events = list(c.responses.create(model=t.model_name, instructions="Answer briefly.", input=first,
                                     max_output_tokens=16, temperature=0, stream=True))
    types = [e.type for e in events]
    done = "response.incomplete" if r.status == "incomplete" else "response.completed"
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], types
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          done], types
    assert set(types[4:-4]) == {"response.output_text.delta"}, types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens > 0
    assert events[0].response.status == "in_progress" and events[0].response.id == events[-1].response.id

    # A stored conversation continues: the same text as the chat with the whole history
    # (instructions are not carried over, as OpenAI does).
    second = "And of Italy?"
    r2 = c.responses.create(model=t.model_name, previous_response_id=r.id, input=second, max_output_tokens=12,
                            temperature=0)
    assert r2.previous_response_id == r.id and r2.instructions is None, r2
    chat2 = c.chat.completions.create(model=t.model_name, max_tokens=12, temperature=0, messages=[
        {"role": "user", "content": first}, {"role": "assistant", "content": r.output_text},
        {"role": "user", "content": second}])
    assert r2.output_text == chat2.choices[0].message.content, (r2.output_text, chat2.choices[0].message.content)
    got = c.responses.retrieve(r2.id)
    assert got.id == r2.id and got.output_text == r2.output_text, got

    # Another tenant sees nothing of it: not by id, not as a conversation to continue.
    other = openai.OpenAI(base_url=f"http://127.0.0.1:{t.port}/v1", api_key=t.other_key, max_retries=0)
    for call in (lambda: other.responses.retrieve(r2.id), lambda: other.responses.delete(r2.id),
                 lambda: other.responses.create(model=t.model_name, previous_response_id=r2.id, input="x",
                                                max_output_tokens=1)):
        try:
            call()
            raise AssertionError("another tenant reached a stored response")
        except openai.NotFoundError as e:
            assert e.body["code"] in ("response_not_found", "previous_response_not_found"), e.body

    c.responses.delete(r2.id)
    for call in (lambda: c.responses.retrieve(r2.id),
                 lambda: c.responses.create(model=t.model_name, previous_response_id=r2.id, input="x")):
        try:
            call()
            raise AssertionError("a deleted response was found")
        except openai.NotFoundError as e:
            assert e.body["code"] in ("response_not_found", "previous_response_not_found"), e.body
    unstored = c.responses.create(model=t.model_name, input="Hi", max_output_tokens=2, store=False)
    try:
        c.responses.retrieve(unstored.id)
        raise AssertionError("a response with store false was stored")
    except openai.NotFoundError:
        pass

    # Structured output through text.format, items with content parts, developer messages.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    rs = c.responses.create(model=t.model_name, max_output_tokens=40, temperature=0,
                            input=[{"role": "developer", "content": "Reply in JSON."},
                                   {"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": "Name a city."}]}],
                            text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    assert rs.text.format.type == "json_schema", rs.text
    if rs.status == "completed":
        j = json.loads(rs.output_text)
        assert set(j) == {"city"} and isinstance(j["city"], str), j

    for kw, param in ((dict(input="x", tools=[{"type": "web_search"}]), "tools"),
                      (dict(input=[{"type": "reasoning", "summary": []}]), "input"),
                      (dict(input=[{"type": "function_call_output", "output": "1"}]), "input"),
                      (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                       "input"),
                      (dict(input="x", max_output_tokens=0), "max_output_tokens"),
                      (dict(input="x", text={"format": {"type": "yaml"}}), "text.format"),
                      (dict(), "input")):
        try:
            c.responses.create(model=t.model_name, **kw)
            raise AssertionError(f"{kw} was accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (kw, e.body)


def t_metrics_for_operators(t):
    """/metrics in a shape Prometheus tooling accepts (HELP and TYPE before each family's
    samples, `_total` exactly on counters, histograms whole) with the series operators read:
    the process, KV use, per-call lengths, queue time and finish reasons, every route by its
    own label."""
    t.client.completions.create(model=t.model_name, prompt="Count: 1, 2,", max_tokens=3, temperature=0)
    request(t.port, "POST", "/tokenize", {"prompt": "hi"}, t.auth)
    st, _, body = request(t.port, "GET", "/metrics", timeout=30)
    assert st == 200
    types, seen_samples = {}, set()
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, ("TYPE twice", name)
            assert name not in seen_samples, ("TYPE after samples", name)
            types[name] = kind
            if kind == "counter":
                assert name.endswith("_total"), name
            else:
                assert not name.endswith("_total"), name
        elif line and not line.startswith("#"):
            sample = line.split("{")[0].split(" ")[0]
            family = next((f for f in (sample, sample.rsplit("_", 1)[0]) if f in types), None)
            if family is None and sample.endswith(("_bucket", "_count", "_sum")):
                family = sample.rsplit("_", 1)[0]
            assert family in types, ("no TYPE for", sample)
            seen_samples.add(family)
    promtool("check", "metrics", stdin=body)
    m = metrics(t.port)
    assert m["process_resident_memory_bytes"] > 20e6 and m["process_virtual_memory_bytes"] > 0, m
    assert m["process_cpu_seconds_total"] > 0 and m["process_open_fds"] >= 3 and m["process_max_fds"] >= 64
    assert abs(m["process_start_time_seconds"] - time.time()) < 86400
    assert 0.0 <= m["metro_kv_usage_ratio"] <= 1.0
    assert m["metro_request_prompt_tokens_count"] >= 1 and m["metro_request_generation_tokens_sum"] >= 3
    assert m["metro_request_queue_time_seconds_count"] >= 1
    assert m['metro_choices_finished_total{finish_reason="length"}'] >= 1, {k: v for k, v in m.items()
                                                                              if "finish" in k}
    assert m.get('metro_http_requests_total{endpoint="/tokenize",status="200"}', 0) >= 1
    # The weights: in RAM, and the file's copy given back where the backend copied them.
    assert m["metro_weights_bytes"] > 50e6 and m["metro_weights_resident_bytes"] > 0.9 * m["metro_weights_bytes"], m
    assert m["metro_weights_file_given_back_bytes"] > 30e6 and m["metro_weights_locked_bytes"] == 0, m
    assert "metro_engine_major_page_faults_total" in m


def t_mlock(ctx):
    """--mlock locks every weight byte in RAM and says so at start and on /metrics; serving is unchanged."""
    srv = MetroServer(ctx.metro, ctx.model_path, ["--mlock", "--ctx", "512", "--ctx-total", "2048", "--admission",
                                                  "off", "-t", str(env_int("METRO_E2E_THREADS", 2))])
    srv.start()
    try:
        srv.wait_ready()
        m = metrics(srv.port)
        assert m["metro_weights_locked_bytes"] >= m["metro_weights_bytes"] > 50e6, m
        assert m["metro_weights_resident_bytes"] >= 0.999 * m["metro_weights_bytes"], m
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert st == 200 and "Paris" in json.loads(body)["choices"][0]["text"], body
        assert srv.wait_line("resident, locked) |"), "".join(srv.lines)
        assert "of the file's copy given back" in "".join(srv.lines)
    finally:
        srv.kill()


def t_mem_budget(ctx):
    """--mem-budget keeps a mixture-of-experts model's experts in a cold file: greedy answers
    are those of the model held whole, /metrics shows the cold bytes, the mapped ones within
    what the budget leaves and experts given back; a budget below what every step reads stops
    the server with a message that says so (the tiny qwen3moe file of tests/fixtures/moe)."""
    import shutil
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model = os.path.join(root, "tests", "fixtures", "moe", "qwen3moe_tiny.gguf")
    # Beside the build, on a disk (a cold store refuses a directory in memory).
    cold_dir = tempfile.mkdtemp(prefix="metro-e2e-cold-", dir=os.path.dirname(os.path.dirname(ctx.metro)))
    args = ["--admission", "off", "--ctx", "128", "--ctx-total", "1024", "-t", "2", "--cold-dir", cold_dir]
    prompts = ["abc", "hello world", "the quick brown fox"]

    def answers(srv):
        out = []
        for p in prompts:
            st, _, data = request(srv.port, "POST", "/v1/completions",
                                  {"prompt": p, "max_tokens": 12, "temperature": 0})
            assert st == 200, (st, data[:200])
            out.append(json.loads(data)["choices"][0]["text"])
        return out

    whole = MetroServer(ctx.metro, model, args)
    whole.start()
    try:
        whole.wait_ready()
        want = answers(whole)
        total = metrics(whole.port)["metro_weights_bytes"]
    finally:
        whole.kill()
    # The budget of the whole file's weights: the experts' cold entries (whole 64 KiB each)
    # take more than it leaves them, so steps give experts back.
    srv = MetroServer(ctx.metro, model, args + ["--mem-budget", str(int(total))])
    srv.start()
    try:
        srv.wait_ready()
        assert answers(srv) == want
        m = metrics(srv.port)
        assert m["metro_weights_budget_bytes"] == int(total), m
        assert m["metro_weights_cold_bytes"] >= 48 * 65536, m
        assert 0 < m["metro_weights_cold_mapped_bytes"] <= m["metro_weights_cold_mapped_limit_bytes"], m
        assert m["metro_weights_cold_releases_total"] > 0 and m["metro_weights_cold_reads_total"] > 0, m
        assert m["metro_weights_bytes"] + m["metro_weights_cold_mapped_limit_bytes"] == int(total), m
        assert srv.wait_line("metro serve: memory budget"), "".join(srv.lines)
    finally:
        srv.kill()
    low = MetroServer(ctx.metro, model, args + ["--mem-budget", "64KiB"])
    r = subprocess.run(low.cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "every step reads" in r.stderr + r.stdout, r
    assert os.listdir(cold_dir) == [], os.listdir(cold_dir)  # the cold file is unlinked from the start
    shutil.rmtree(cold_dir, ignore_errors=True)


TESTS = [t_models, t_chat, t_completions, t_n2, t_stop, t_logprobs, t_seed, t_usage, t_prefix_cache, t_embeddings,
         t_unknown_model, t_invalid_utf8_output, t_tokenize_detokenize, t_responses, t_metrics_for_operators]


def t_served_model_names(ctx):
    """--served-model-name A B: both names are listed and answered, responses report the first."""
    srv = MetroServer(ctx.metro, ctx.model_path, ["--served-model-name", "first-name", "org/second", "--ctx", "512",
                                                  "--ctx-total", "2048", "--admission", "off",
                                                  "-t", str(env_int("METRO_E2E_THREADS", 2))])
    srv.start()
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", timeout=120,
                               max_retries=0)
        assert [m.id for m in client.models.list().data] == ["first-name", "org/second"]
        assert client.models.retrieve("org/second").id == "org/second"
        for name in ("first-name", "org/second"):
            r = client.completions.create(model=name, prompt="Hi", max_tokens=2, temperature=0)
            assert r.model == "first-name", r.model
        r = client.chat.completions.create(model="org/second", max_tokens=2,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert r.model == "first-name", r.model
        try:
            client.completions.create(model=ctx.model_name, prompt="Hi", max_tokens=1)
            raise AssertionError("the file's name answered although other names were given")
        except openai.NotFoundError as e:
            assert "first-name" in e.body["message"] and "org/second" in e.body["message"], e.body
    finally:
        srv.kill()
    for args, want in ((["--served-model-name", "a", "--model-name", "b"], "excludes"),
                       (["--served-model-name", "a", "a"], "given twice"),
                       (["--served-model-name"], "served-model-name")):
        p = subprocess.run([ctx.metro, "serve", "-m", ctx.model_path, "--port", "0"] + args, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:])


def t_request_ids_and_json_logs(ctx):
    """Every response carries x-request-id (the client's when usable); --log-format json
    writes one access record per request with the id, the caller's trace and the call's
    numbers."""
    srv = MetroServer(ctx.metro, ctx.model_path, ["--model-name", ctx.model_name, "--log-format", "json", "--ctx",
                                                  "512", "--ctx-total", "2048", "--admission", "off",
                                                  "-t", str(env_int("METRO_E2E_THREADS", 2))])
    srv.start()
    try:
        srv.wait_ready()
        trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        body = {"model": ctx.model_name, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
        st, h, _ = request(srv.port, "POST", "/v1/completions", body,
                           {"x-request-id": "client-id-1", "traceparent": f"00-{trace}-00f067aa0ba902b7-01"})
        assert st == 200 and h.get("x-request-id") == "client-id-1", (st, h)
        st, h, _ = request(srv.port, "POST", "/v1/completions", dict(body, stream=True), {"x-request-id": "bad id"})
        assert st == 200 and h.get("x-request-id", "").startswith("req_"), h
        streamed_id = h["x-request-id"]
        st, h, _ = request(srv.port, "POST", "/v1/completions", dict(body, max_tokens=0))
        assert st == 400 and h.get("x-request-id", "").startswith("req_"), (st, h)
        st, h, _ = request(srv.port, "GET", "/health")
        assert st == 200 and "x-request-id" in h, h
        deadline = time.time() + 10
        records = {}
        # The 400's record may reach the log after the others: wait for all three.
        while time.time() < deadline and not ({"client-id-1", streamed_id} <= set(records) and
                                              any(r["status"] == 400 for r in records.values())):
            for line in list(srv.lines):
                if line.startswith("{"):
                    rec = json.loads(line)
                    if rec.get("msg") == "request":
                        records[rec["id"]] = rec
            time.sleep(0.1)
        a = records["client-id-1"]
        assert a["trace_id"] == trace and a["parent_id"] == "00f067aa0ba902b7", a
        assert a["status"] == 200 and a["path"] == "/v1/completions" and a["method"] == "POST", a
        assert a["model"] == ctx.model_name and a["class"] == "standard", a
        assert a["prompt_tokens"] > 0 and a["completion_tokens"] == 3 and 0 < a["ttft_s"] <= a["e2e_s"], a
        assert a["ts"].endswith("Z") and "T" in a["ts"], a
        b = records[streamed_id]
        assert b["stream"] is True and b["completion_tokens"] == 3 and "trace_id" not in b, b
        assert any(r["status"] == 400 for r in records.values()), records
    finally:
        srv.kill()


def t_variants_split_and_stickiness(ctx):
    """Several models and a variant with -m NAME=FILE / NAME@VARIANT=FILE, and --split: the
    variant's share of 2000 users (400 under the sanitizers) within binomial bounds, the same
    user on the same variant every time, every response naming its variant (header and system_fingerprint), per-variant
    engine series that add up, and the flags' refusals."""
    import concurrent.futures
    srv = MetroServer(ctx.metro, ctx.model_path, [
        "-m", f"chat@canary={ctx.model_path}", "-m", f"other={ctx.model_path}", "--served-model-name", "chat",
        "--split", "chat:canary=25", "--admission", "off", "--ctx", "256", "--ctx-total", "2048",
        "-t", str(env_int("METRO_E2E_THREADS", 2))])
    srv.start()
    try:
        srv.wait_ready()
        st, _, data = request(srv.port, "GET", "/v1/models")
        assert [m["id"] for m in json.loads(data)["data"]] == ["chat", "other"], data
        before = metrics(srv.port)

        def ask(user, model="chat"):
            st, h, data = request(srv.port, "POST", "/v1/completions",
                                  {"model": model, "prompt": "Hi", "max_tokens": 1, "user": user})
            assert st == 200, data[:200]
            variant = h["x-metro-variant"]
            fp = json.loads(data)["system_fingerprint"]
            assert fp == ("metro" if variant == "primary" else "metro@" + variant), (variant, fp)
            return variant

        n = 400 if os.environ.get("METRO_SANITIZED") else 2000
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            first = list(pool.map(ask, [f"user-{i}" for i in range(n)]))
        canary = first.count("canary")
        # Binomial(n, 0.25), 4.5 standard deviations either side (400: 100 +- 39; 2000: 500 +- 87).
        sd = math.sqrt(n * 0.25 * 0.75)
        assert abs(canary - n / 4) <= 4.5 * sd and set(first) == {"primary", "canary"}, canary
        for i in range(0, 40, 2):
            assert ask(f"user-{i}") == first[i], i
        assert ask("anyone", model="other") == "primary"
        # No --admin-key-file: no admin API at all.
        assert request(srv.port, "GET", "/admin/models")[0] == 404
        # An error is counted under the variant that would have served it.
        canary_user = f"user-{first.index('canary')}"
        st, h, _ = request(srv.port, "POST", "/v1/completions",
                           {"model": "chat", "prompt": "Hi", "max_tokens": 0, "user": canary_user})
        assert st == 400 and h["x-metro-variant"] == "canary", (st, h)
        after = metrics(srv.port)
        answered = {(v, s): after.get(f'metro_variant_requests_total{{model="chat",variant="{v}",status="{s}"}}', 0)
                    for v in ("primary", "canary") for s in (200, 400)}
        again = first[0:40:2].count("canary")
        assert answered == {("canary", 200): canary + again, ("primary", 200): n + 20 - canary - again,
                            ("canary", 400): 1, ("primary", 400): 0}, answered
        assert after['metro_variant_share{model="chat",variant="canary"}'] == 0.25
        grew = {m: after[f'metro_requests_finished_total{{model="{m}"}}'] -
                before[f'metro_requests_finished_total{{model="{m}"}}'] for m in ("chat", "chat@canary")}
        assert grew["chat@canary"] == canary + first[0:40:2].count("canary"), grew
        assert grew["chat"] + grew["chat@canary"] == n + 20, grew
        ctx.note(f"split: {canary} of {n} users on the 25% canary")
    finally:
        srv.kill()
    m = ctx.model_path
    for args, want in ((["-m", m, "--split", "x:nope=5"], "no variant 'nope'"),
                       (["-m", m, "-m", f"lone@v={m}"], "needs 'lone' itself"),
                       (["-m", m, "-m", m], "only one model may go without a name"),
                       (["-m", m, "--served-model-name", "c", "-m", f"c@a={m}", "-m", f"c@b={m}",
                         "--split", "c:a=60", "--split", "c:b=50"], "more than 100%"),
                       (["-m", m, "--served-model-name", "c", "-m", f"c@a={m}", "--split", "c:a=x"],
                        "a number from 0 to 100")):
        p = subprocess.run([ctx.metro, "serve", "--port", "0"] + args, capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:])


def t_cli_progress_lines(ctx):
    """`metro bench` on a terminal draws progress lines (the model file's load, then the
    runs) redrawn in place, ending at 100%; with stderr a pipe, none at all."""
    import pty
    args = [ctx.metro, "bench", "-m", ctx.model_path, "-p", "16", "-n", "4", "-r", "2", "-t", "1"]
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the pty's other end closed
            break
        if not chunk:
            break
        err += chunk
    out, _ = p.communicate(timeout=120)
    os.close(master)
    text = err.decode(errors="replace")
    assert p.returncode == 0, (p.returncode, text[-500:])
    assert "\rload [" in text and "\rbench [" in text, text[-500:]
    assert "100%" in text, text[-500:]
    assert b"tg4" in out, out[-300:]  # the results still go to stdout
    piped = subprocess.run(args, capture_output=True, timeout=120)
    assert piped.returncode == 0 and b"\r" not in piped.stderr, piped.stderr[-300:]


def t_kv_spill(ctx):
    """--kv-spill-dir: a prompt whose prefix-cache blocks two others evicted from a small KV
    budget is read back from the spill file (cached_tokens), answers the same greedy text, and
    the tier's series are on /metrics (promtool-clean); no block stays in use."""
    import shutil
    import tempfile
    spill_dir = tempfile.mkdtemp(prefix="metro-e2e-spill-")
    srv = MetroServer(ctx.metro, ctx.model_path, ["--model-name", "m", "--ctx", "512", "--ctx-total", "512",
                                                  "--kv-spill-dir", spill_dir, "--kv-spill-bytes", "64MiB",
                                                  "--admission", "off",
                                                  "-t", str(env_int("METRO_E2E_THREADS", 2))])
    srv.start()
    try:
        srv.wait_ready()

        def ask(topic):
            prompt = " ".join(f"{topic} note {k}." for k in range(70))  # about 330 tokens
            st, _, data = request(srv.port, "POST", "/v1/completions",
                                  {"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0})
            assert st == 200, data[:300]
            return json.loads(data)

        first = ask("trains")
        ask("oceans")
        ask("volcanoes")
        again = ask("trains")
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 256, again["usage"]
        assert again["choices"][0]["text"] == first["choices"][0]["text"], (first, again)
        m = metrics(srv.port)
        assert m['metro_kv_spill_restores_total{model="m"}'] >= 16, m.get('metro_kv_spill_restores_total{model="m"}')
        assert m['metro_prefix_cache_restored_tokens_total{model="m"}'] >= 256
        assert m['metro_kv_spill_corrupt_total{model="m"}'] == 0 and m['metro_kv_spill_failed{model="m"}'] == 0
        # Admission asked for the prompt's spilled blocks to be read ahead; on an idle server
        # the step may restore them before the read-ahead is done, so only the bound holds.
        assert 0 <= m['metro_kv_spill_prefetch_hits_total{model="m"}'] <= m['metro_kv_spill_prefetched_total{model="m"}']
        assert m['metro_kv_blocks_used{model="m"}'] == 0
        promtool("check", "metrics", stdin=request(srv.port, "GET", "/metrics")[2])
        assert any(f.startswith("kv-spill-") for f in os.listdir(spill_dir)), os.listdir(spill_dir)
        ctx.note(f"KV spill: {cached} of {again['usage']['prompt_tokens']} prompt tokens read back after eviction")
    finally:
        srv.kill()
        srv.proc.wait(timeout=30)
    shutil.rmtree(spill_dir, ignore_errors=True)


SEPARATE_SERVER_TESTS = [t_served_model_names, t_mlock, t_mem_budget, t_request_ids_and_json_logs, t_variants_split_and_stickiness,
                         t_cli_progress_lines, t_kv_spill]
