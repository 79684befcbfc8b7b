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


class RouterProc:
    def __init__(self, metro, upstreams, policy):
        cmd = [metro, "router", "--port", "0", "--policy", policy, "--health-period", "0.2"]
        for u in upstreams:
            cmd += ["--upstream", u]
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


def replica(ctx):
    srv = MetroServer(ctx.metro, ctx.model_path, ["--model-name", "m", "--ctx", "1024", "--ctx-total", "8192",
                                                  "--admission", "off", "-t", "1", "--metrics-compat", "vllm"])
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


TESTS = [t_router_over_two_replicas]
