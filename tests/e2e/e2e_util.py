"""Helpers for metro's end-to-end server tests: a metro serve process, raw HTTP, metrics,
an asyncio SSE client, and a tiny test harness that prints 'N passed, N failed'."""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


def wait_listening(proc, lines, timeout, what):
    """Reads a metro process's output into `lines` until its "listening on
    http://127.0.0.1:PORT" line (serve and router print one once bound); returns PORT."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited early:\n" + "".join(lines))
        lines.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return int(m.group(1))
    raise RuntimeError(f"{what}: no 'listening on' line in {timeout} s:\n" + "".join(lines))


class MetroServer:
    """`metro serve` on a free loopback port; stdout/stderr are collected."""

    def __init__(self, metro, model, args):
        self.cmd = [metro, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0"] + list(args)
        self.proc = None
        self.port = None
        self.lines = []
        self.listening_at = None

    def start(self, timeout=60):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace")
        self.port = wait_listening(self.proc, self.lines, timeout, "metro serve")
        self.listening_at = time.time()
        threading.Thread(target=self._drain_output, daemon=True).start()
        return self

    def _drain_output(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                status, _, _ = request(self.port, "GET", "/ready", timeout=5)
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("metro serve exited:\n" + "".join(self.lines))
            time.sleep(0.05)
        raise RuntimeError("not ready in time")

    def wait_line(self, text, timeout=30):
        """True once a line holding `text` was printed: the server writes its startup report
        after it answers /ready, and the reader thread may lag behind it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def output(self):
        return "".join(self.lines)


def request(port, method, path, body=None, headers=None, timeout=120):
    """One HTTP request on a fresh connection: (status, headers dict lower-cased, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = dict(headers or {})
            headers.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def raw_exchange(port, payload, timeout=30, read_all=True):
    """Sends raw bytes and returns what comes back until the server closes (or one response)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(payload)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            chunks.append(b)
            if not read_all and b"\r\n\r\n" in b"".join(chunks):
                data = b"".join(chunks)
                head, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"content-length: (\d+)", head.lower())
                if m and len(rest) >= int(m.group(1)):
                    break
        return b"".join(chunks)
    finally:
        s.close()


def parse_raw_response(data):
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode("latin-1"), body


def promtool(*args, stdin=None):
    """Runs Prometheus's promtool (METRO_PROMTOOL, set by run_e2e.sh); asserts it passed."""
    tool = os.environ.get("METRO_PROMTOOL", "")
    assert tool and os.access(tool, os.X_OK), "METRO_PROMTOOL names no promtool (tests/e2e/run_e2e.sh sets it)"
    p = subprocess.run([tool, *args], input=stdin, capture_output=True, timeout=120)
    out = p.stdout.decode() + p.stderr.decode()
    assert p.returncode == 0, (args, out[-3000:])
    return out


def without_model_label(sample):
    """`name{model="m",k="v"}` -> `name{k="v"}` (and `name{model="m"}` -> `name`)."""
    return re.sub(r'\{model="(?:[^"\\]|\\.)*",?', "{", sample).replace("{}", "")


def metrics(port):
    """Every sample by its full name, and summed over models by its name without the
    `model` label (one model served: its own values)."""
    status, _, body = request(port, "GET", "/metrics", timeout=30)
    assert status == 200, status
    out = {}
    summed = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
        key = without_model_label(name)
        if key != name:
            summed[key] = summed.get(key, 0.0) + float(value)
    for key, value in summed.items():
        out.setdefault(key, value)
    return out


def check_error(status, body, want_status, want_code=None, forbidden=()):
    assert status == want_status, f"status {status}, want {want_status}: {body[:300]!r}"
    j = json.loads(body)
    err = j["error"]
    assert isinstance(err["message"], str) and err["message"], j
    assert "type" in err and "param" in err and "code" in err, j
    if want_code is not None:
        assert err["code"] == want_code, f"code {err['code']}, want {want_code}"
    text = body.decode("utf-8", "replace")
    for secret in forbidden:
        assert secret not in text, f"error body echoes {secret!r}"
    return err


# ---- asyncio streaming client --------------------------------------------------------------

async def read_headers(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode("latin-1").lower()


async def iter_chunks(reader):
    """Yields the payloads of an HTTP/1.1 chunked body."""
    while True:
        line = await reader.readline()
        if not line:
            return
        size = int(line.strip(), 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def sse_request(port, path, body, api_key, on_event=None, connect_timeout=60):
    """Streams one SSE request. on_event(payload) may return True to hang up early.
    Returns (status, events, hung_up)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), connect_timeout)
    raw = json.dumps(body).encode()
    writer.write((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Authorization: Bearer {api_key}\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw)
    await writer.drain()
    events, hung_up = [], False
    try:
        status, _ = await read_headers(reader)
        if status != 200:
            return status, events, hung_up
        buf = b""
        async for chunk in iter_chunks(reader):
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                assert ev.startswith(b"data: "), ev
                payload = ev[6:].decode()
                events.append(payload)
                if on_event and on_event(payload):
                    hung_up = True
                    return status, events, hung_up
        return status, events, hung_up
    finally:
        writer.close()


# ---- harness -------------------------------------------------------------------------------

class Harness:
    def __init__(self):
        self.passed, self.failed, self.timings = 0, 0, []

    def run(self, name, fn, *args):
        t0 = time.time()
        try:
            fn(*args)
            self.passed += 1
            verdict = "PASS"
        except Exception:  # noqa: BLE001 - a test harness reports every failure
            self.failed += 1
            verdict = "FAIL"
            traceback.print_exc()
        dt = time.time() - t0
        self.timings.append((name, dt, verdict))
        print(f"[{verdict}] {name} ({dt:.1f} s)", flush=True)

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        return 0 if self.failed == 0 else 1
