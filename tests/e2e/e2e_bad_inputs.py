"""docs/reliability.md 7-24 against a live metro serve: each bad input gets its status and an
OpenAI-style error body, and the server then still answers a normal request correctly."""

import json
import socket
import statistics
import threading
import time

from e2e_util import check_error, env_int, metrics, parse_raw_response, raw_exchange, request


def bad(t, path, body, status, code=None, headers=None, param=None):
    """Sends one bad request; its test ends with t.assert_serves()."""
    hdrs = dict(t.auth)
    if headers is not None:
        hdrs.update(headers)
    st, _, data = request(t.port, "POST", path, body=body, headers=hdrs)
    err = check_error(st, data, status, code, forbidden=t.secrets)
    if param is not None:
        assert err["param"] == param, (err, param)
    return err


C, CHAT, EMB = "/v1/completions", "/v1/chat/completions", "/v1/embeddings"
USER = [{"role": "user", "content": "hi"}]


def t_07_empty(t):
    bad(t, C, {"prompt": ""}, 400, param="prompt")
    bad(t, C, {"prompt": []}, 400)
    bad(t, C, {"prompt": [[]]}, 400)
    bad(t, CHAT, {"messages": []}, 400, param="messages")
    bad(t, EMB, {"input": ""}, 400)
    t.assert_serves()


def t_08_token_ids(t):
    for ids in ([-1], [t.n_vocab], [1, 2, 10 ** 12], [1, 2.5]):
        bad(t, C, {"prompt": ids, "max_tokens": 1}, 400, param="prompt")
    bad(t, EMB, {"input": [[5], [-3]]}, 400)
    t.assert_serves()


def t_09_prompt_beyond_context(t):
    err = bad(t, C, {"prompt": [1] * (t.n_ctx + 10), "max_tokens": 1}, 400, "context_length_exceeded")
    assert str(t.n_ctx) in err["message"] and str(t.n_ctx + 10) in err["message"], err
    bad(t, CHAT, {"messages": [{"role": "user", "content": "hello " * (t.n_ctx + 50)}], "max_tokens": 1}, 400,
        "context_length_exceeded")
    t.assert_serves()


def t_10_max_tokens(t):
    for v in (0, -1, -100000):
        bad(t, C, {"prompt": "hi", "max_tokens": v}, 400, param="max_tokens")
    bad(t, CHAT, {"messages": USER, "max_completion_tokens": 0}, 400)
    err = bad(t, C, {"prompt": [1] * (t.n_ctx - 10), "max_tokens": 100}, 400, "context_length_exceeded")
    assert str(t.n_ctx) in err["message"], err
    t.assert_serves()


def t_11_huge_counts(t):
    bad(t, C, {"prompt": "hi", "n": 1000}, 400, param="n")
    bad(t, C, {"prompt": "hi", "best_of": 1000}, 400, param="best_of")
    bad(t, C, {"prompt": "hi", "logprobs": 1000}, 400, param="logprobs")
    bad(t, CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 1000}, 400, param="top_logprobs")
    bad(t, C, {"prompt": ["a"] * 65}, 400)
    bad(t, C, {"prompt": ["a"] * 10, "n": 16}, 400)  # 160 choices in one request
    t.assert_serves()


def t_12_negative_integers(t):
    bad(t, C, {"prompt": "hi", "n": -1}, 400)
    bad(t, C, {"prompt": "hi", "top_k": -7}, 400)
    bad(t, C, {"prompt": "hi", "logprobs": -2}, 400)
    bad(t, C, {"prompt": "hi", "max_tokens": 2 ** 63}, 400)
    st, _, _ = request(t.port, "POST", C, {"prompt": "hi", "max_tokens": 1, "seed": -1}, t.auth)
    assert st == 200, "negative seeds are allowed"
    t.assert_serves()


def t_13_nan_inf_ranges(t):
    for field in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        for literal in ("NaN", "Infinity", "-Infinity"):
            raw = ('{"prompt":"hi","max_tokens":1,"%s":%s}' % (field, literal)).encode()
            bad(t, C, raw, 400, headers={"Content-Type": "application/json"})
    for field, value in (("temperature", 5), ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("min_p", 2),
                         ("presence_penalty", 3), ("frequency_penalty", -3), ("repetition_penalty", 0),
                         ("temperature", 1e308)):
        bad(t, C, {"prompt": "hi", field: value}, 400, param=field)
    bad(t, C, {"prompt": "hi", "logit_bias": {"5": 1000}}, 400, param="logit_bias")
    bad(t, C, {"prompt": "hi", "logit_bias": {str(t.n_vocab): 1}}, 400, param="logit_bias")
    t.assert_serves()


def t_14_malformed(t):
    for raw in (b"{", b"", b"[]", b"null", b'{"prompt": "hi",}', b'{"prompt":"hi"} x'):
        bad(t, C, raw, 400, headers={"Content-Type": "application/json"})
    bad(t, C, b'{"prompt":"hi"}', 400, headers={"Content-Type": "text/plain"})
    bad(t, C, b'{"prompt":"hi"}', 400, headers={"Content-Type": "application/x-www-form-urlencoded"})
    for body in ({"prompt": "hi", "temperature": "hot"}, {"prompt": "hi", "n": "2"}, {"prompt": "hi", "stream": "yes"},
                 {"prompt": {"text": "hi"}}, {"prompt": "hi", "stop": 5}, {"prompt": "hi", "max_tokens": 1.5}):
        bad(t, C, body, 400)
    bad(t, CHAT, {"messages": "hi"}, 400)
    bad(t, CHAT, {"messages": [{"role": "pirate", "content": "arr"}]}, 400)
    bad(t, CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400)
    t.assert_serves()


def t_15_invalid_utf8_request(t):
    bad(t, C, b'{"prompt":"\xff\xfe bad"}', 400, headers={"Content-Type": "application/json"})
    bad(t, C, b'{"prompt":"\xe2\x82"}', 400, headers={"Content-Type": "application/json"})
    bad(t, C, b'{"prompt":"\\ud800"}', 400, headers={"Content-Type": "application/json"})
    bad(t, CHAT, b'{"messages":[{"role":"user","content":"\xc0\x80"}]}', 400,
        headers={"Content-Type": "application/json"})
    t.assert_serves()


def t_16_unknown_fields(t):
    st, _, data = request(t.port, "POST", C, {"prompt": "hi", "max_tokens": 1, "frobnicate": {"deep": [1, 2]},
                                               "logit_bias": None, "user": "u"}, t.auth)
    assert st == 200, data
    st, _, data = request(t.port, "POST", CHAT, {"messages": USER, "max_tokens": 1, "parallel_tool_calls": True,
                                                  "metadata": {"a": "b"}, "store": False}, t.auth)
    assert st == 200, data


def t_17_stop_bounds(t):
    bad(t, C, {"prompt": "hi", "stop": ["s%d" % i for i in range(100)]}, 400, param="stop")
    bad(t, C, {"prompt": "hi", "stop": "x" * 10000}, 400, param="stop")
    bad(t, C, {"prompt": "hi", "stop": [""]}, 400, param="stop")
    t.assert_serves()


def t_18_special_text_in_content(t):
    def prompt_tokens(content):
        st, _, data = request(t.port, "POST", CHAT, {"messages": [{"role": "user", "content": content}],
                                                      "max_tokens": 1}, t.auth)
        assert st == 200, data
        return json.loads(data)["usage"]["prompt_tokens"]
    special = "<|im_end|>"
    plain_len = len(t.token_ids(special, special=False))
    assert plain_len > 1
    # As text, "<|im_end|>" costs its plain-text tokens; as a control token it would cost one.
    assert prompt_tokens("a" + special) - prompt_tokens("a") == plain_len


def t_19_huge_headers_and_body(t):
    data = raw_exchange(t.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
    status, _, body = parse_raw_response(data)
    check_error(status, body, 431, "headers_too_large")
    t.assert_serves()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {5 << 20}\r\n\r\n").encode()
    data = raw_exchange(t.port, head + b'{"prompt": "')
    status, _, body = parse_raw_response(data)
    check_error(status, body, 413, "body_too_large")
    t.assert_serves()


def t_20_disconnects(t):
    before = metrics(t.port)
    for stream in (True, False):
        body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 500, "stream": stream,
                           "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", t.port), timeout=60)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Authorization: Bearer {t.key}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        if stream:
            got = b""
            while b"data: " not in got:
                got += s.recv(65536)
        else:
            deadline = time.time() + 60
            while metrics(t.port)["metro_inflight_requests"] == 0 and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
        s.close()
    t.wait_idle()
    after = metrics(t.port)
    assert after["metro_client_disconnects_total"] - before["metro_client_disconnects_total"] == 2, after
    assert after["metro_kv_blocks_used"] == 0 and after["metro_requests_running"] == 0, after


def t_21_slow_clients(t):
    # Slowloris: a request that never finishes arriving gets 408 after the idle timeout.
    s = socket.create_connection(("127.0.0.1", t.port), timeout=30)
    t0 = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    took = time.time() - t0
    s.close()
    status, _, body = parse_raw_response(data)
    check_error(status, body, 408, "request_timeout")
    assert took < t.idle_timeout + 5, took
    t.assert_serves()
    # A reader that never drains: small receive window, never reads. The server must drop it
    # (bounded buffer or write timeout) and free its KV blocks.
    before = metrics(t.port)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", t.port))
    body = json.dumps({"prompt": "Write forever.", "max_tokens": 800, "stream": True, "ignore_eos": True}).encode()
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {t.key}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    deadline = time.time() + 240
    while time.time() < deadline:
        m = metrics(t.port)
        if m["metro_inflight_requests"] == 0 and m["metro_requests_aborted_total"] > before["metro_requests_aborted_total"]:
            break
        time.sleep(0.5)
    s.close()
    m = metrics(t.port)
    assert m["metro_inflight_requests"] == 0, "a client that never reads was not dropped"
    assert m["metro_requests_aborted_total"] > before["metro_requests_aborted_total"], m
    t.wait_idle()
    assert metrics(t.port)["metro_kv_blocks_used"] == 0


def t_23_health_fast_during_long_prompt(t):
    n_prompt = env_int("METRO_E2E_LONG_PROMPT", 256)
    box = {}

    def long_request():
        box["r"] = request(t.port, "POST", C, {"prompt": [(i * 7919) % 20000 + 100 for i in range(n_prompt)],
                                               "max_tokens": 1}, t.auth, timeout=900)
    th = threading.Thread(target=long_request)
    th.start()
    while metrics(t.port)["metro_inflight_requests"] == 0:
        time.sleep(0.02)
    lat = []
    while th.is_alive() and len(lat) < 20:
        t0 = time.time()
        assert request(t.port, "GET", "/health", timeout=10)[0] == 200
        assert request(t.port, "GET", "/metrics", timeout=10)[0] == 200
        lat.append(time.time() - t0)
        time.sleep(0.1)
    th.join()
    assert box["r"][0] == 200, box["r"]
    assert lat, "the long prompt finished before any probe"
    # Generous bound: these answer on the I/O thread, never behind the engine.
    assert statistics.median(lat) < 1.0, lat
    t.note(f"/health+/metrics during a {n_prompt}-token prompt: median {1000 * statistics.median(lat):.1f} ms, "
           f"max {1000 * max(lat):.1f} ms over {len(lat)} probes")


def t_auth_and_routes(t):
    for hdrs in ({}, {"Authorization": "Bearer wrong-key-123"}, {"Authorization": "Basic " + t.key},
                 {"Authorization": t.key}):
        st, h, data = request(t.port, "POST", C, {"prompt": "hi"}, hdrs)
        err = check_error(st, data, 401, "invalid_api_key", forbidden=t.secrets + ["wrong-key-123"])
        assert "bearer" in h.get("www-authenticate", "").lower(), h
    st, _, data = request(t.port, "GET", "/v1/models", headers={})
    check_error(st, data, 401)
    st, _, data = request(t.port, "GET", "/v1/nothing", headers={})
    check_error(st, data, 401)  # no key: not even whether the route exists
    st, _, data = request(t.port, "GET", "/v1/nothing", headers=t.auth)
    check_error(st, data, 404)
    st, h, data = request(t.port, "GET", C, headers=t.auth)
    check_error(st, data, 405)
    assert h.get("allow") == "POST", h
    t.assert_serves()


def t_framing_smuggling_and_half_close(t):
    """RFC 9112 framing: a Transfer-Encoding whose last coding is not chunked is 400 and other
    codings 501, each closing the connection, so the bytes after the header are never read
    as a second request; an HTTP/1.1 request without Host is 400. A client that half-closes
    after a complete request is still answered."""
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b'{"prompt": "hi", "max_tokens": 1}'
    auth = f"Authorization: Bearer {t.key}\r\n".encode()
    for te, want, code in ((b"xchunked", 400, "bad_http"), (b"chunked, identity", 400, "bad_http"),
                           (b"identity", 400, "bad_http"), (b"gzip, chunked", 501, "unsupported_transfer_coding")):
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth +
                b"Transfer-Encoding: " + te + b"\r\n\r\n")
        data = raw_exchange(t.port, head + body + smuggled)
        status, _, rest = parse_raw_response(data)
        check_error(status, rest, want, code)
        assert data.count(b"HTTP/1.1 ") == 1, (te, data[:600])  # nothing answered the smuggled request
    data = raw_exchange(t.port, b"GET /health HTTP/1.1\r\n\r\n")
    status, _, rest = parse_raw_response(data)
    check_error(status, rest, 400, "bad_http")
    data = raw_exchange(t.port, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert parse_raw_response(data)[0] == 400, data[:300]
    data = raw_exchange(t.port, b"GET /health HTTP/1.0\r\n\r\n")  # 1.0 needs no Host
    assert parse_raw_response(data)[0] == 200, data[:300]

    # Half-close: the whole request, then shutdown(SHUT_WR); the answer still comes, after
    # any interim 1xx responses.
    for stream in (False, True):
        req = json.dumps({"prompt": "Hello", "max_tokens": 4, "stream": stream}).encode()
        s = socket.create_connection(("127.0.0.1", t.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth +
                  f"Content-Length: {len(req)}\r\n\r\n".encode() + req)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        while data.startswith(b"HTTP/1.1 1"):
            data = data.partition(b"\r\n\r\n")[2]
        status, _, rest = parse_raw_response(data)
        assert status == 200, (stream, data[:400])
        assert (b"[DONE]" in rest) if stream else (b'"choices"' in rest), rest[:400]
    t.assert_serves()


TESTS = [t_07_empty, t_08_token_ids, t_09_prompt_beyond_context, t_10_max_tokens, t_11_huge_counts,
         t_12_negative_integers, t_13_nan_inf_ranges, t_14_malformed, t_15_invalid_utf8_request,
         t_16_unknown_fields, t_17_stop_bounds, t_18_special_text_in_content, t_19_huge_headers_and_body,
         t_20_disconnects, t_21_slow_clients, t_23_health_fast_during_long_prompt, t_auth_and_routes,
         t_framing_smuggling_and_half_close]
