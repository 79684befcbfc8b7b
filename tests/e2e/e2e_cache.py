"""Encoders and the semantic cache on live servers: all-MiniLM-L6-v2 converted by
`metro convert` and served on /v1/embeddings against sentence-transformers' embeddings;
`metro serve --semantic-cache` answering paraphrases from earlier answers, per tenant."""
import concurrent.futures
import json
import math
import os
import subprocess
import time

import openai

from e2e_util import MetroServer, env_int, metrics, promtool, request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MINILM_DIR = os.environ.get("METRO_MINILM_DIR", os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "embeddings", "minilm_sentence_transformers.json")


def converted_minilm(ctx, type_name="f16"):
    """The MiniLM directory as GGUF (converted once per run)."""
    out = os.path.join(ctx.tmp, f"minilm-{type_name}.gguf")
    if not os.path.exists(out):
        assert os.path.exists(os.path.join(MINILM_DIR, "model.safetensors")), "run `make model-minilm`"
        p = subprocess.run([ctx.metro, "convert", MINILM_DIR, out, "--type", type_name], capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "bert, 101 tensors, 30522 tokens" in p.stderr, p.stderr
    return out


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def threads():
    return str(env_int("METRO_E2E_THREADS", 2))


def t_bert_embeddings_match_sentence_transformers(ctx):
    """`metro convert` + `metro serve` on all-MiniLM-L6-v2: through the openai SDK (base64
    and float encodings), 20 fixture sentences in one request embed within cosine 0.999 of
    sentence-transformers', token counts equal its tokenizer's; /tokenize gives its ids;
    chat and completions are refused with 400 (an encoder makes embeddings only)."""
    fx = json.load(open(FIXTURE))
    items = [i for i in fx["items"] if len(i["ids"]) < fx["max_seq_length"]][:20]
    srv = MetroServer(ctx.metro, converted_minilm(ctx), ["--model-name", "minilm", "-t", threads()])
    srv.start()
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="x", max_retries=0)
        r = client.embeddings.create(model="minilm", input=[i["text"] for i in items])
        worst = min(cosine(d.embedding, i["embedding"]) for d, i in zip(r.data, items))
        assert worst >= 0.999, worst
        assert r.usage.prompt_tokens == sum(len(i["ids"]) for i in items), r.usage
        f = client.embeddings.create(model="minilm", input=items[0]["text"], encoding_format="float")
        assert cosine(f.data[0].embedding, items[0]["embedding"]) >= 0.999
        st, _, body = request(srv.port, "POST", "/tokenize", {"model": "minilm", "prompt": items[3]["text"]})
        assert st == 200 and json.loads(body)["tokens"] == items[3]["ids"], body[:300]
        for path, body in (("/v1/chat/completions", {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"model": "minilm", "prompt": "hi"})):
            st, _, data = request(srv.port, "POST", path, body)
            assert st == 400, (path, st, data[:300])
        ctx.note(f"MiniLM served: worst cosine {worst:.6f} to sentence-transformers over {len(items)} sentences")
    finally:
        srv.kill()


def chat(port, key, text, **extra):
    body = {"model": "m", "messages": [{"role": "system", "content": "Answer in one short sentence."},
                                       {"role": "user", "content": text}],
            "temperature": 0, "max_tokens": 12, "metro": {"semantic_cache": True}}
    body.update(extra)
    st, _, data = request(port, "POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})
    assert st == 200, (st, data[:300])
    return json.loads(data)


def stream_chat(port, key, text):
    body = {"model": "m", "messages": [{"role": "system", "content": "Answer in one short sentence."},
                                       {"role": "user", "content": text}],
            "temperature": 0, "max_tokens": 12, "stream": True, "metro": {"semantic_cache": True}}
    st, _, data = request(port, "POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})
    assert st == 200, (st, data[:300])
    chunks = [json.loads(line[6:]) for line in data.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, [c.get("metro") for c in chunks]


def wait_kept(port, n):
    """Answers are kept by a prep thread after the response: wait until n are in."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if metrics(port).get("metro_semantic_cache_inserts_total", 0) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} answers kept in 30 s")


def t_semantic_cache(ctx):
    """--semantic-cache with the converted MiniLM as --cache-embed-model: a paraphrase of an
    answered question is answered from the cache (same text, marked with its similarity,
    streamed too), a different question and the same question from another tenant are
    computed, a tenant without cache=on and requests that do not opt in or sample without a
    seed never touch it; 24 concurrent requests lose none; with every hit verified, each hit
    is counted agreed or disagreed; the metrics pass promtool."""
    keys = os.path.join(ctx.tmp, "cache-keys.txt")
    with open(keys, "w") as f:
        f.write("sk-cache-tenant-a-000000 a cache=on\nsk-cache-tenant-b-000000 b cache=on\n"
                "sk-cache-tenant-c-000000 c\n")
    a, b, c = "sk-cache-tenant-a-000000", "sk-cache-tenant-b-000000", "sk-cache-tenant-c-000000"
    embed = converted_minilm(ctx)
    srv = MetroServer(ctx.metro, ctx.model_path, [
        "--model-name", "m", "--api-key-file", keys, "--semantic-cache", "--cache-embed-model", embed,
        "--cache-verify-share", "0", "--ctx", "512", "--ctx-total", "4096", "--admission", "off", "-t", threads()])
    srv.start()
    try:
        srv.wait_ready()
        q = "What is the capital of France?"
        first = chat(srv.port, a, q)
        assert "metro" not in first, first
        wait_kept(srv.port, 1)
        para = chat(srv.port, a, "Which city is the capital of France?")
        assert para.get("metro", {}).get("cache") == "semantic", para
        assert 0.9 <= para["metro"]["similarity"] < 1.0, para["metro"]
        assert para["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert para["usage"]["completion_tokens"] == first["usage"]["completion_tokens"]
        other = chat(srv.port, a, "How many legs does a spider have?")
        assert "metro" not in other
        assert "metro" not in chat(srv.port, b, q), "tenant b must not see tenant a's answers"
        wait_kept(srv.port, 3)
        assert "metro" not in chat(srv.port, c, q), "tenant c has no cache=on"
        assert "metro" not in chat(srv.port, a, q, metro={}), "not opted in"
        assert "metro" not in chat(srv.port, a, q, temperature=0.9), "sampling without a seed"
        text, marks = stream_chat(srv.port, a, "Tell me the capital city of France.")
        assert text == first["choices"][0]["message"]["content"], text
        assert marks and all(m and m["cache"] == "semantic" for m in marks), marks
        m = metrics(srv.port)
        assert m["metro_semantic_cache_hits_total"] == 2, m
        assert m["metro_semantic_cache_entries"] >= 3, m
        promtool("check", "metrics", stdin=request(srv.port, "GET", "/metrics")[2])
        # Concurrent: four questions, six phrasings each, all at once.
        groups = [["What is the capital of Italy?", "Which city is Italy's capital?", "Name the capital of Italy.",
                   "Italy's capital city is which?", "What city is the capital of Italy?", "Capital of Italy?"],
                  ["How do I boil an egg?", "How should I boil an egg?", "What is the way to boil an egg?",
                   "Boiling an egg: how?", "How do you boil eggs?", "Explain how to boil an egg."],
                  ["What is 2 plus 2?", "What does 2 + 2 equal?", "How much is two plus two?",
                   "2+2 = ?", "Add 2 and 2.", "What is the sum of 2 and 2?"],
                  ["Who wrote Hamlet?", "Who is the author of Hamlet?", "Hamlet was written by whom?",
                   "Which writer wrote Hamlet?", "Name the author of Hamlet.", "Who penned Hamlet?"]]
        with concurrent.futures.ThreadPoolExecutor(24) as ex:
            answers = list(ex.map(lambda t: chat(srv.port, a, t), [t for g in groups for t in g]))
        assert len(answers) == 24 and all(x["choices"][0]["message"]["content"] is not None for x in answers)
    finally:
        srv.kill()
    srv = MetroServer(ctx.metro, ctx.model_path, [
        "--model-name", "m", "--semantic-cache", "--cache-embed-model", embed, "--cache-verify-share", "1",
        "--ctx", "512", "--ctx-total", "4096", "--admission", "off", "-t", threads()])
    srv.start()
    try:
        srv.wait_ready()
        for i, text in enumerate(("What is the capital of France?", "Which city is the capital of France?",
                                  "What's the capital of France?", "What is the capital of France?")):
            r = chat(srv.port, "none", text)
            assert "metro" not in r, "a verified hit answers with what it computed"
            if i == 0:
                wait_kept(srv.port, 1)
        m = metrics(srv.port)
        agreed = m.get('metro_semantic_cache_verified_total{result="agree"}', 0)
        verified = agreed + m.get('metro_semantic_cache_verified_total{result="disagree"}', 0)
        assert verified == m["metro_semantic_cache_hits_total"] and verified >= 1, m
        ctx.note(f"semantic cache verified {int(verified)} hits: {int(agreed)} agreed")
    finally:
        srv.kill()


TESTS = [t_bert_embeddings_match_sentence_transformers, t_semantic_cache]
