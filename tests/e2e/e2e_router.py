"""`metro router` in front of two live replicas: answers and streams through it, prefix
affinity for a shared system prompt, a replica killed mid-stream (the stream ends with an
error event, the pool shrinks, requests keep succeeding), /metrics through promtool; the
replicas' `--metrics-compat vllm` names."""
import json
import subprocess
import threading
import time

import openai

from e2e_util import MetroServer, env_int, metrics, promtool, request, wait_listening
from webdriver import free_port


class RouterProc:
    def __init__(self, metro, upstreams, policy, kv_events=()):
        cmd = [metro, "router", "--port", "0", "--policy", policy, "--health-period", "0.2"]
        for u in upstreams:
            cmd += ["--upstream", u]
        for e in kv_events:
            cmd += ["--kv-events", e]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.port = wait_listening(self.proc, self.lines, 30, "metro router")
        threading.Thread(target=lambda: [self.lines.append(l) for l in self.proc.stdout], daemon=True).start()

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def replica(ctx, extra=()):
    srv = MetroServer(ctx.metro, ctx.model_path, ["--model-name", "m", "--ctx", "1024", "--ctx-total", "8192",
                                                  "--admission", "off", "-t", "1", "--metrics-compat", "vllm",
                                                  *extra])
    srv.start()
    srv.wait_ready()
    return srv


def routed(port):
    m = metrics(port)
    return {k: v for k, v in m.items() if k.startswith("metro_router_requests_total")}


def t_router_over_two_replicas(ctx):
    """Two replicas behind `metro router --policy prefix`: the SDK's chat, streamed chat and
    completions come back through it; eight requests sharing a long system prompt all go to
    one replica; a replica killed while it streams ends that stream with an error event
    (never a hang), leaves the pool, and the next requests succeed on the other; /metrics
    passes promtool; SIGTERM stops the router with 0."""
    reps = [replica(ctx), replica(ctx)]
    router = RouterProc(ctx.metro, [f"http://127.0.0.1:{r.port}" for r in reps], "prefix")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.port}/v1", api_key="x", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=8, temperature=0)
        assert r.choices[0].message.content, r
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, stream=True)
            if c.choices)
        assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
        c = client.completions.create(model="m", prompt="The capital of France is", max_tokens=4, temperature=0)
        assert c.choices[0].text
        before = routed(router.port)
        system = "You are a meticulous assistant for a logistics company. " * 12
        for i in range(8):
            client.chat.completions.create(model="m", max_tokens=4, temperature=0, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}])
        after = routed(router.port)
        got = sorted(after[k] - before.get(k, 0) for k in after)
        assert got[-1] == 8, ("the shared prefix went to more than one replica", before, after)
        promtool("check", "metrics", stdin=request(router.port, "GET", "/metrics")[2])
        # --metrics-compat vllm: the names the inference extension's endpoint picker reads.
        rm = metrics(reps[0].port)
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:gpu_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            assert f'{name}{{model_name="m"}}' in rm, (name, sorted(k for k in rm if k.startswith("vllm")))
        assert rm['vllm:prompt_tokens_total{model_name="m"}'] == rm["metro_prompt_tokens_total"], rm
        # (promtool's lint refuses colons in exported names, as it does for vLLM's own /metrics:
        # these are the names fleet schedulers look for, so they stay.)
        # Kill whichever replica serves a long stream, once it has sent something.
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count to 500."}],
                                                max_tokens=400, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True})
        first = next(iter(stream))
        assert first is not None
        # The role chunk can come back before the scheduler has seated the request (the
        # running gauge moves at the step), so wait for one replica to show it running.
        deadline = time.time() + 10
        busy = []
        while time.time() < deadline:
            busy = [i for i, rep in enumerate(reps)
                    if metrics(rep.port).get("metro_requests_running", 0) > 0]
            if busy:
                break
            time.sleep(0.05)
        assert len(busy) == 1, busy
        victim = busy[0]
        reps[victim].kill()
        t0 = time.time()
        try:
            for _ in stream:
                pass
            raise AssertionError("the stream of a killed replica ended without an error")
        except openai.APIError as e:
            assert "lost" in str(e), e
        assert time.time() - t0 < 30
        deadline = time.time() + 10
        while time.time() < deadline and metrics(router.port).get(
                f'metro_router_upstream_healthy{{upstream="http://127.0.0.1:{reps[victim].port}"}}', 1) != 0:
            time.sleep(0.1)
        for i in range(3):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Hi {i}"}],
                                               max_tokens=4, temperature=0)
            assert r.choices[0].message.content is not None
        m = metrics(router.port)
        assert m[f'metro_router_upstream_healthy{{upstream="http://127.0.0.1:{reps[victim].port}"}}'] == 0, m
        assert m[f'metro_router_upstream_lost_total{{upstream="http://127.0.0.1:{reps[victim].port}"}}'] >= 1, m
        ctx.note(f"router: 8 shared-prefix requests to one replica; killed replica {victim} mid-stream, "
                 f"stream ended with upstream_lost in {time.time() - t0:.1f} s")
        assert router.stop() == 0, "".join(router.lines[-5:])
    finally:
        router.proc.kill()
        for rep in reps:
            rep.kill()


def wait_metric(port, name, pred, timeout=20):
    deadline = time.time() + timeout
    value = None
    while time.time() < deadline:
        value = metrics(port).get(name, 0)
        if pred(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"{name} stayed at {value}")


def t_router_follows_kv_events(ctx):
    """`metro router --kv-events` (one endpoint per replica's `metro serve --kv-events`): a
    long system prompt sent straight to one replica, bypassing the router, is routed to
    that replica afterwards, because its KV events say it holds the prompt's blocks (the
    router learns the prompt's tokens from a replica's /tokenize); done for each replica
    in turn, so chance cannot pass it; /metrics shows the view and passes promtool; a
    wrong count of endpoints is refused."""
    ports = [free_port(), free_port()]
    reps = [replica(ctx, ["--kv-events", f"tcp://*:{p}"]) for p in ports]
    ups = [f"http://127.0.0.1:{r.port}" for r in reps]
    bad = subprocess.run([ctx.metro, "router", "--port", "0", "--upstream", ups[0], "--upstream", ups[1],
                          "--kv-events", f"tcp://127.0.0.1:{ports[0]}"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "one endpoint per --upstream" in bad.stderr, bad.stderr
    router = RouterProc(ctx.metro, ups, "prefix", [f"tcp://127.0.0.1:{p}" for p in ports])
    try:
        direct = [openai.OpenAI(base_url=f"{u}/v1", api_key="x", max_retries=0, timeout=120) for u in ups]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.port}/v1", api_key="x", max_retries=0, timeout=120)
        # A subscriber misses what is published before it joins: publish until the router
        # has heard from both replicas.
        deadline = time.time() + 30
        while time.time() < deadline and metrics(router.port).get("metro_router_kv_event_batches_total", 0) < 2:
            for d in direct:
                d.completions.create(model="m", prompt=f"Warm up {time.time()} " * 8, max_tokens=1, temperature=0)
            time.sleep(0.2)
        for target in (1, 0):
            system = f"You are assistant number {target} of a shipping firm; answer in one word. " * 10
            blocks_name = f'metro_router_kv_blocks{{upstream="{ups[target]}"}}'
            held = metrics(router.port).get(blocks_name, 0)
            direct[target].chat.completions.create(model="m", max_tokens=2, temperature=0, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": "First?"}])
            wait_metric(router.port, blocks_name, lambda v, h=held: v >= h + 8)
            before = routed(router.port)
            kv_before = metrics(router.port).get("metro_router_kv_routed_total", 0)
            for i in range(3):
                client.chat.completions.create(model="m", max_tokens=2, temperature=0, messages=[
                    {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}])
            after = routed(router.port)
            key = f'metro_router_requests_total{{upstream="{ups[target]}"}}'
            assert after[key] - before.get(key, 0) == 3, (target, before, after)
            assert metrics(router.port)["metro_router_kv_routed_total"] - kv_before == 3
        m = metrics(router.port)
        assert m.get("metro_router_tokenize_failed_total", 0) == 0, m
        promtool("check", "metrics", stdin=request(router.port, "GET", "/metrics")[2])
        held = [int(m['metro_router_kv_blocks{upstream="' + u + '"}']) for u in ups]
        ctx.note(f"router --kv-events: {int(m['metro_router_kv_event_batches_total'])} batches, blocks held {held}")
        assert router.stop() == 0, "".join(router.lines[-5:])
    finally:
        router.proc.kill()
        for rep in reps:
            rep.kill()


TESTS = [t_router_over_two_replicas, t_router_follows_kv_events]
