"""Variants under guard on live servers: rollouts that promote a healthy canary and roll a
failing one back, injected faults, the circuit breaker, and the admin API."""
import concurrent.futures
import json
import os
import subprocess
import tempfile
import threading
import time

from e2e_util import MetroServer, env_int, metrics, promtool, request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ADMIN_KEY = "admin-key-for-the-e2e-tests-0123"
# Under the sanitizers requests are several times slower: two steps and a looser alpha
# (fewer requests per step) keep the rollout test to the same few thousand requests or less.
SANITIZED = bool(os.environ.get("METRO_SANITIZED"))


def admin_key_file():
    f = tempfile.NamedTemporaryFile("w", suffix=".key", delete=False)
    f.write(ADMIN_KEY + "\n")
    f.close()
    return f.name


def admin(port, method, path, key=ADMIN_KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    st, _, data = request(port, method, path, headers=headers, timeout=30)
    return st, (json.loads(data) if data else None)


def ask(port, model, user, max_tokens=2):
    """One completion: (status, variant header, error code or None)."""
    st, h, data = request(port, "POST", "/v1/completions",
                          {"model": model, "prompt": "Hi", "max_tokens": max_tokens, "user": user})
    code = None
    if st != 200:
        code = json.loads(data)["error"].get("code")
    return st, h.get("x-metro-variant"), code


def variant_server(ctx, key, args):
    """`metro serve` of the default model with `args`, the admin key file `key`, and the
    small context and KV these tests need."""
    return MetroServer(ctx.metro, ctx.model_path, list(args) + [
        "--admin-key-file", key, "--admission", "off", "--ctx", "256", "--ctx-total", "2048",
        "-t", str(env_int("METRO_E2E_THREADS", 2))])


def rollout_state(port, model):
    st, j = admin(port, "GET", "/admin/models")
    assert st == 200, j
    return [r for r in j["rollouts"] if r["model"] == model][0]


STEPS = "5,100" if SANITIZED else "5,50,100"


def t_rollout_promotes_a_healthy_canary_and_rolls_a_failing_one_back(ctx):
    """Two names under rollout at once, each 5%, 50%, 100% with 2 s steps: `chat`'s canary has
    20% injected errors (--fault) and must be rolled back on its error rate alone, within a few
    dozen of its requests; `docs`'s canary is as healthy as its primary and must reach 100%.
    Every request gets an answer (200, or the injected 500) and nothing is lost."""
    m = ctx.model_path
    key = admin_key_file()
    srv = variant_server(ctx, key, [
        "--served-model-name", "chat", "-m", f"chat@bad={m}", "-m", f"docs={m}", "-m", f"docs@good={m}",
        "--rollout", f"chat:bad={STEPS}@2s", "--rollout", f"docs:good={STEPS}@2s", "--rollout-min-requests", "10",
        # The healthy canary's latency tests run beside a primary on the same two cores under
        # whatever else the machine runs: a tighter false-alarm bound (the error test still
        # catches the bad canary within the bound below), and no shadow scoring competing for
        # the cores (t_rollout_rolls_back_damaged_weights tests it).
        "--rollout-alpha", "0.05" if SANITIZED else "0.0001", "--rollout-shadow-every", "0",
        "--fault", "chat@bad:error=0.2", "--breaker-failures", "0"])
    srv.start()
    try:
        srv.wait_ready()
        assert rollout_state(srv.port, "chat")["state"] == "running"
        before = metrics(srv.port)
        assert before['metro_variant_share{model="chat",variant="bad"}'] == 0.05, before
        counts = {}
        lost = []
        lock = threading.Lock()
        users = iter(range(10 ** 9))

        def one(model):
            with lock:
                u = next(users)
            try:
                st, variant, code = ask(srv.port, model, f"user-{u}")
            except OSError as e:
                with lock:
                    lost.append(repr(e))
                return
            k = (model, variant, st, code)
            with lock:
                counts[k] = counts.get(k, 0) + 1

        deadline = time.time() + 240
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            while time.time() < deadline:
                list(pool.map(one, ["chat", "docs"] * 8))
                if (rollout_state(srv.port, "chat")["state"] != "running" and
                        rollout_state(srv.port, "docs")["state"] != "running"):
                    break
        chat, docs = rollout_state(srv.port, "chat"), rollout_state(srv.port, "docs")
        assert not lost, lost[:3]
        assert chat["state"] == "rolled_back" and chat["cause"] == "error_rate", chat
        assert docs["state"] == "promoted" and docs["step"] == len(STEPS.split(",")), docs
        for (model, variant, st, code), n in counts.items():
            assert st == 200 or (model, variant, st, code) == ("chat", "bad", 500, "fault_injected"), counts
        bad_requests = sum(n for (mo, v, _, _), n in counts.items() if mo == "chat" and v == "bad")
        # Detection: the CUSUM needs a few dozen canary requests at these rates; a rollout that
        # had run all three steps would have sent it hundreds.
        assert bad_requests <= 120, (bad_requests, counts)
        after = metrics(srv.port)
        assert after.get('metro_variant_share{model="chat",variant="bad"}', 0.0) == 0.0, after
        assert after['metro_variant_share{model="docs",variant="good"}'] == 1.0
        assert after['metro_variant_rollbacks_total{model="chat",variant="bad",cause="error_rate"}'] == 1
        assert after['metro_variant_promotions_total{model="docs",variant="good"}'] == len(STEPS.split(","))
        injected = after['metro_fault_injected_total{model="chat",variant="bad",kind="error"}']
        assert injected == counts.get(("chat", "bad", 500, "fault_injected"), 0), (injected, counts)
        # After the rollback every chat request is the primary's; after the promotion every docs
        # request is the canary's.
        for i in range(20):
            assert ask(srv.port, "chat", f"after-{i}")[1] == "primary"
            assert ask(srv.port, "docs", f"after-{i}")[1] == "good"
        # Caught at the share it started at: a step waits for the requests the test needs.
        assert "rolled back at step 1 (5%): error_rate" in srv.output(), srv.output()[-2000:]
        ctx.note(f"rollout: the 20%-error canary rolled back after {bad_requests} of its requests; "
                 f"the healthy one promoted to 100%")
    finally:
        srv.kill()
        os.unlink(key)


def t_rollout_rolls_back_damaged_weights(ctx):
    """A canary whose file is valid but whose weights are damaged (5% of the file's tensor
    bytes zeroed) answers without errors and about as fast: only its output is wrong. Its
    shadow-scored answers (KL from the primary's model) roll it back; no request fails."""
    m = ctx.model_path
    damaged = os.path.join(ctx.tmp, "damaged.gguf")
    with open(m, "rb") as f:
        data = bytearray(f.read())
    lo, hi = int(len(data) * 0.55), int(len(data) * 0.60)
    data[lo:hi] = bytes(hi - lo)
    with open(damaged, "wb") as f:
        f.write(data)
    key = admin_key_file()
    srv = variant_server(ctx, key, [
        "--served-model-name", "chat", "-m", f"chat@broken={damaged}", "--rollout", "chat:broken=50,100@1h",
        "--rollout-shadow-every", "1"])
    srv.start()
    try:
        srv.wait_ready()
        statuses = {}
        deadline = time.time() + (600 if SANITIZED else 180)
        i = 0
        while time.time() < deadline and rollout_state(srv.port, "chat")["state"] == "running":
            st, variant, _ = ask(srv.port, "chat", f"user-{i}", max_tokens=12)
            statuses[(variant, st)] = statuses.get((variant, st), 0) + 1
            i += 1
        r = rollout_state(srv.port, "chat")
        assert r["state"] == "rolled_back" and r["cause"] == "shadow_kl", (r, statuses)
        assert r["shadow"]["kl_mean"] > 0.5, r
        assert all(st == 200 for (_, st) in statuses), statuses
        assert ask(srv.port, "chat", "after")[1] == "primary"
        assert metrics(srv.port)['metro_variant_rollbacks_total{model="chat",variant="broken",cause="shadow_kl"}'] == 1
        ctx.note(f"damaged canary rolled back on shadow KL {r['shadow']['kl_mean']:.2f} after "
                 f"{statuses.get(('broken', 200), 0)} of its answers ({r['shadow']['scored']} scored)")
    finally:
        srv.kill()
        os.unlink(key)


def t_breaker_faults_and_admin_api(ctx):
    """A canary that fails every request (--fault error=1) opens its breaker after 3 failures
    in a row; its users are then served by the primary. Injected latency delays a model's
    answers. The admin API: refused without its key, lists models with share and breaker, sets
    a split, rolls back (counted "manual"), starts a rollout, refuses bad actions."""
    m = ctx.model_path
    key = admin_key_file()
    srv = variant_server(ctx, key, [
        "--served-model-name", "chat", "-m", f"chat@canary={m}", "-m", f"slow={m}", "--split", "chat:canary=50",
        "--fault", "canary:error=1,status=502", "--fault", "slow:latency=400ms",
        "--breaker-failures", "3", "--breaker-open", "60"])
    srv.start()
    try:
        srv.wait_ready()
        seen = []
        for i in range(60):
            seen.append(ask(srv.port, "chat", f"user-{i}"))
        failed = [s for s in seen if s[0] != 200]
        assert len(failed) == 3 and all(s == (502, "canary", "fault_injected") for s in failed), seen
        # After the third failure, users whom the split gives the canary get the primary.
        third = [i for i, s in enumerate(seen) if s[0] != 200][-1]
        assert all(s == (200, "primary", None) for s in seen[third + 1:]), seen
        mt = metrics(srv.port)
        assert mt['metro_breaker_state{model="chat",variant="canary"}'] == 2, mt
        assert mt['metro_breaker_state{model="chat",variant="primary"}'] == 0, mt

        t0 = time.time()
        st, _, _ = ask(srv.port, "slow", "u")
        assert st == 200 and time.time() - t0 >= 0.4, time.time() - t0

        assert admin(srv.port, "GET", "/admin/models", key=None)[0] == 401
        assert admin(srv.port, "GET", "/admin/models", key="wrong-key-wrong-key")[0] == 401
        st, j = admin(srv.port, "GET", "/admin/models")
        assert st == 200, j
        by_id = {x["id"]: x for x in j["models"]}
        assert by_id["chat@canary"]["breaker"] == "open" and by_id["chat@canary"]["share"] == 0.5, j
        assert by_id["chat"]["share"] == 0.5 and by_id["slow"]["share"] == 1.0, j
        st, j = admin(srv.port, "POST", "/admin/models/chat/split?variant=canary&share=20")
        assert st == 200 and {x["id"]: x["share"] for x in j["models"]}["chat@canary"] == 0.2, j
        st, j = admin(srv.port, "POST", "/admin/models/chat/rollback?variant=canary")
        assert st == 200 and {x["id"]: x["share"] for x in j["models"]}["chat@canary"] == 0.0, j
        assert metrics(srv.port)['metro_variant_rollbacks_total{model="chat",variant="canary",cause="manual"}'] == 1
        st, j = admin(srv.port, "POST", "/admin/models/chat/rollout?variant=canary&steps=10,100&step=1m")
        assert st == 200 and j["rollouts"][0]["state"] == "running" and j["rollouts"][0]["steps"] == [10, 100], j
        st, j = admin(srv.port, "POST", "/admin/models/chat/promote?variant=canary")
        assert st == 200 and j["rollouts"][0]["state"] == "promoted", j
        assert {x["id"]: x["share"] for x in j["models"]}["chat@canary"] == 1.0, j
        # Drain: no new requests, not a rollback.
        st, j = admin(srv.port, "POST", "/admin/models/chat/rollout?variant=canary&steps=30,100&step=1m")
        assert st == 200 and j["rollouts"][0]["state"] == "running", j
        st, j = admin(srv.port, "POST", "/admin/models/chat/drain?variant=canary")
        assert st == 200 and j["rollouts"][0]["state"] == "drained", j
        assert {x["id"]: x["share"] for x in j["models"]}["chat@canary"] == 0.0, j
        assert all(ask(srv.port, "chat", f"drained-{i}")[1] == "primary" for i in range(10))
        assert metrics(srv.port)['metro_variant_rollbacks_total{model="chat",variant="canary",cause="manual"}'] == 1
        for path, want in (("/admin/models/chat/split?variant=nope&share=5", 400),
                           ("/admin/models/chat/split?variant=canary&share=500", 400),
                           ("/admin/models/chat/split?variant=canary", 400),
                           ("/admin/models/chat/explode?variant=canary", 404),
                           ("/admin/models/chat/rollout?variant=canary&steps=50,10&step=1m", 400)):
            st, j = admin(srv.port, "POST", path)
            assert st == want, (path, st, j)
        assert admin(srv.port, "GET", "/admin/models/chat/split?variant=canary&share=5")[0] == 405
    finally:
        srv.kill()
        os.unlink(key)
    for args, want in ((["--rollout", "x:y=5@1m"], "no variant 'y'"),
                       (["-m", f"c@v={m}", "--served-model-name", "c", "--rollout", "c:v=50,10@1m"], "must increase"),
                       (["-m", f"c@v={m}", "--served-model-name", "c", "--rollout", "c:v=5,50"], "NAME:VARIANT="),
                       (["-m", f"c@v={m}", "--served-model-name", "c", "--rollout", "c:v=5@1m", "--split", "c:v=5"],
                        "give one"),
                       (["--fault", "nope:error=0.5"], "no model 'nope'"),
                       (["-m", f"c@v={m}", "--served-model-name", "c", "--fault", "v:error=2"], "share from 0 to 1"),
                       (["-m", f"c@v={m}", "--served-model-name", "c", "--fault", "v:boom=1"], "unknown key"),
                       (["--admin-key-file", "/nonexistent/key"], "cannot read it")):
        p = subprocess.run([ctx.metro, "serve", "--port", "0", "-m", m] + args, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:])


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


def t_hot_load_and_unload_under_load(ctx):
    """While clients keep asking `chat`, the admin API loads the model file again as `extra`
    and as the variant `chat@v2` (202, then listed as loaded), both serve, a rollout of the
    variant starts; then `extra` is unloaded while requests to it are in flight (they finish
    with 200), and the variant replaces the primary (promote, swap, unload the old one). No
    request of the steady load fails, no KV block is left in use, and the process's memory
    returns near its level before the loads."""
    m = ctx.model_path
    key = admin_key_file()
    # The rollout here only has to run while swap is refused; its tests are not what is checked,
    # so their false-alarm bound is the tightest (a CI machine's outside load must not roll it back).
    srv = variant_server(ctx, key, ["--served-model-name", "chat", "--rollout-alpha", "1e-9"])
    stop = threading.Event()  # set on every way out, so a failed check cannot leave the load running
    threads = []
    srv.start()
    try:
        srv.wait_ready()
        for i in range(4):
            assert ask(srv.port, "chat", f"warm-{i}")[0] == 200
        rss_before = rss_mib(srv.proc.pid)
        results = []
        lock = threading.Lock()

        def steady(i):
            n = 0
            while not stop.is_set():
                try:
                    r = ask(srv.port, "chat", f"steady-{i}-{n}", max_tokens=4)
                except OSError as e:
                    r = (repr(e), None, None)
                with lock:
                    results.append(r)
                n += 1

        threads.extend(threading.Thread(target=steady, args=(i,)) for i in range(4))
        for t in threads:
            t.start()

        def wait_loaded(ident):
            deadline = time.time() + 120
            while time.time() < deadline:
                st, j = admin(srv.port, "GET", "/admin/models")
                loads = [x for x in j["loads"] if x["id"] == ident]
                if loads and loads[-1]["state"] != "loading":
                    assert loads[-1]["state"] == "loaded", loads
                    return
                time.sleep(0.1)
            raise AssertionError(f"{ident} not loaded in time")

        st, j = admin(srv.port, "POST", f"/admin/models/extra/load?path={m}")
        assert st == 202 and j["loads"][-1]["state"] == "loading", (st, j)
        st, j = admin(srv.port, "POST", f"/admin/models/chat/load?variant=v2&path={m}")
        assert st == 202, (st, j)
        wait_loaded("extra")
        wait_loaded("chat@v2")
        rss_loaded = rss_mib(srv.proc.pid)
        st, _, data = request(srv.port, "GET", "/v1/models")
        assert [x["id"] for x in json.loads(data)["data"]] == ["chat", "extra"], data
        assert ask(srv.port, "extra", "u")[0:2] == (200, "primary")
        st, j = admin(srv.port, "POST", "/admin/models/chat/rollout?variant=v2&steps=50,100&step=1h")
        assert st == 200, j
        variants = set()
        for i in range(40):
            variants.add(ask(srv.port, "chat", f"split-{i}")[1])
        assert variants == {"primary", "v2"}, variants
        # In flight while unloaded: they finish on the engine they started on.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            inflight = [pool.submit(ask, srv.port, "extra", f"inflight-{i}", 48) for i in range(4)]
            time.sleep(0.3)
            st, j = admin(srv.port, "POST", "/admin/models/extra/unload")
            assert st == 200 and "extra" not in {x["id"] for x in j["models"]}, (st, j)
            assert [f.result()[0] for f in inflight] == [200] * 4
        st, _, data = request(srv.port, "POST", "/v1/completions", {"model": "extra", "prompt": "Hi", "max_tokens": 1})
        assert st == 404, (st, data[:200])
        # A primary with a variant is not unloaded. The variant replaces it: promoted to 100%,
        # swapped into the primary's place, the old primary (now `chat@v2`) unloaded.
        assert admin(srv.port, "POST", "/admin/models/chat/unload")[0] == 400
        ro = rollout_state(srv.port, "chat")
        assert ro["state"] == "running", ro
        assert admin(srv.port, "POST", "/admin/models/chat/swap?variant=v2")[0] == 400  # its rollout runs
        assert admin(srv.port, "POST", "/admin/models/chat/promote?variant=v2")[0] == 200
        time.sleep(1.0)  # the primary's last requests finish; it gets no new ones
        gen = 'metro_generation_tokens_total{model="%s"}'
        old_primary_tokens = metrics(srv.port)[gen % "chat"]
        st, j = admin(srv.port, "POST", "/admin/models/chat/swap?variant=v2")
        assert st == 200, j
        assert {x["id"]: x["share"] for x in j["models"]} == {"chat": 1.0, "chat@v2": 0.0}, j["models"]
        assert ask(srv.port, "chat", "after-swap")[0:2] == (200, "primary")
        # The old primary's engine now shows as chat@v2 (its count frozen), the new one as chat.
        time.sleep(0.5)
        _, _, text = request(srv.port, "GET", "/metrics", timeout=30)
        lines = [x for x in text.decode().splitlines() if x.startswith("metro_generation_tokens_total{")]
        assert len(lines) == len(set(x.rpartition(" ")[0] for x in lines)), lines  # no series twice
        promtool("check", "metrics", stdin=text)
        mt = metrics(srv.port)
        assert mt[gen % "chat@v2"] == old_primary_tokens, (old_primary_tokens, mt[gen % "chat@v2"], mt[gen % "chat"])
        # The old primary leaves while the new one serves the steady load.
        st, j = admin(srv.port, "POST", "/admin/models/chat/unload?variant=v2")
        assert st == 200 and [x["id"] for x in j["models"]] == ["chat"], j
        assert admin(srv.port, "POST", "/admin/models/chat/unload")[0] == 400  # the only model
        assert admin(srv.port, "POST", "/admin/models/nope/load?variant=x&path=" + m)[0] == 400
        assert admin(srv.port, "POST", "/admin/models/chat/load?path=" + m)[0] == 400  # served already
        st, j = admin(srv.port, "POST", "/admin/models/broken/load?path=/nonexistent.gguf")
        assert st == 202, j
        deadline = time.time() + 30
        while time.time() < deadline:
            load = [x for x in admin(srv.port, "GET", "/admin/models")[1]["loads"] if x["id"] == "broken"][-1]
            if load["state"] != "loading":
                break
            time.sleep(0.1)
        assert load["state"] == "failed" and "nonexistent" in load["error"], load
        stop.set()
        for t in threads:
            t.join()
        bad = [r for r in results if r[0] != 200]
        assert not bad and len(results) > 20, (len(results), bad[:3])
        for i in range(3):  # engines of unloaded models stop once their last request ends
            time.sleep(0.5)
        mt = metrics(srv.port)
        assert mt['metro_kv_blocks_used{model="chat"}'] == 0, mt.get('metro_kv_blocks_used{model="chat"}')
        assert not any('model="extra"' in k or 'model="chat@v2"' in k for k in mt if k.startswith("metro_kv_")), \
            [k for k in mt if "extra" in k][:5]
        rss_after = rss_mib(srv.proc.pid)
        # Two more copies of the model (weights and KV) came and went.
        assert rss_loaded - rss_before > 100, (rss_before, rss_loaded)
        # (AddressSanitizer's allocator holds freed memory in its quarantine: no RSS bound there.)
        if not SANITIZED:
            assert rss_after - rss_before < 0.4 * (rss_loaded - rss_before), (rss_before, rss_loaded, rss_after)
        ctx.note(f"hot load/unload: {len(results)} steady requests, 0 failed; RSS {rss_before:.0f} -> "
                 f"{rss_loaded:.0f} -> {rss_after:.0f} MiB")
    finally:
        stop.set()
        srv.kill()
        for t in threads:
            t.join(timeout=60)
        os.unlink(key)


def t_feedback_rolls_back_a_disliked_canary(ctx):
    """POST /v1/feedback rates answers by their body id or x-request-id: counted per variant,
    refused for unknown ids, and a canary whose answers users rate bad (the primary's good)
    is rolled back with cause `feedback`."""
    m = ctx.model_path
    key = admin_key_file()
    srv = variant_server(ctx, key, [
        "--served-model-name", "chat", "-m", f"chat@canary={m}", "--rollout", "chat:canary=50,100@1h",
        "--rollout-shadow-every", "0"])
    srv.start()
    try:
        srv.wait_ready()
        rated = {"primary": 0, "canary": 0}
        i = 0
        while rollout_state(srv.port, "chat")["state"] == "running" and i < 200:
            st, h, data = request(srv.port, "POST", "/v1/chat/completions",
                                  {"model": "chat", "messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 2, "user": f"user-{i}"})
            assert st == 200, data[:200]
            variant = h["x-metro-variant"]
            # Canary answers rated by their body id, primary ones by x-request-id.
            ident = json.loads(data)["id"] if variant == "canary" else h["x-request-id"]
            rating = -1 if variant == "canary" else (1 if i % 10 else -1)
            st, _, fb = request(srv.port, "POST", "/v1/feedback", {"id": ident, "rating": rating})
            assert st == 200 and json.loads(fb)["rating"] == ("good" if rating == 1 else "bad"), fb
            rated[variant] += 1
            i += 1
        r = rollout_state(srv.port, "chat")
        assert r["state"] == "rolled_back" and r["cause"] == "feedback", (r, rated)
        assert rated["canary"] <= 30, rated
        mt = metrics(srv.port)
        assert mt['metro_variant_feedback_total{model="chat",variant="canary",rating="bad"}'] == rated["canary"], mt
        for body, want in (({"id": "chatcmpl-nope", "rating": 1}, 404), ({"id": "x", "rating": 2}, 400),
                           ({"rating": 1}, 400), ({"id": "x", "rating": 1, "extra": 1}, 400)):
            st, _, data = request(srv.port, "POST", "/v1/feedback", body)
            assert st == want, (body, st, data[:200])
        ctx.note(f"feedback: canary rolled back after {rated['canary']} bad ratings")
    finally:
        srv.kill()
        os.unlink(key)


def t_config_file(ctx):
    """`metro serve --config FILE`: a deployment in one TOML file (models, a variant, its
    split, limits), every key a long option's name; the command line wins over the file; a
    misspelt key and a bad value are refused by name."""
    m = ctx.model_path
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write("# one deployment\n"
                f'model = ["{m}", "chat@canary={m}"]\n'
                'served-model-name = ["chat"]\n'
                'split = ["chat:canary=50"]\n'
                'admission = "off"\n'
                "ctx = 256\n"
                "ctx-total = 2048\n"
                f"threads = {env_int('METRO_E2E_THREADS', 2)}\n")
        path = f.name
    try:
        for extra, want in (([], {"primary", "canary"}), (["--split", "chat:canary=100"], {"canary"})):
            srv = MetroServer(ctx.metro, m, [])
            srv.cmd = [ctx.metro, "serve", "--config", path, "--host", "127.0.0.1", "--port", "0"] + extra
            srv.start()
            try:
                srv.wait_ready()
                st, _, data = request(srv.port, "GET", "/v1/models")
                assert [x["id"] for x in json.loads(data)["data"]] == ["chat"], data
                seen = {ask(srv.port, "chat", f"user-{i}")[1] for i in range(30)}
                assert seen == want, (extra, seen)
                assert "context 256 tokens" in srv.output() and "KV capacity 2048 tokens" in srv.output()
            finally:
                srv.kill()
        for text, want in (("modle = 1\n", "modle"), (f'model = "{m}"\nport = "x"\n', "--port")):
            with open(path, "w") as f:
                f.write(text)
            p = subprocess.run([ctx.metro, "serve", "--config", path], capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and want in p.stderr, (text, p.returncode, p.stderr[-300:])
    finally:
        os.unlink(path)


def t_lora_adapters_share_the_base_engine(ctx):
    """`--lora NAME=FILE` serves the first model with the adapter as BASE:NAME, applied per
    request in the base's own engine: both are listed, a request picks one by `model`, the
    adapted ones answer differently (the tiny llama file and adapter of tests/fixtures/lora),
    the same requests sent at once (so sharing steps) answer as they did alone, one engine
    serves them all (one KV pool on /metrics), an unknown adapter name is a 404; a bad
    value or a file that is not an adapter stops the server."""
    fx = os.path.join(ROOT, "tests", "fixtures", "lora")
    model, adapter = os.path.join(fx, "llama_tiny.gguf"), os.path.join(fx, "llama_tiny_lora.gguf")
    srv = MetroServer(ctx.metro, model, ["--served-model-name", "tiny", "--lora", f"ad={adapter}",
                                         "--lora-scaled", f"half={adapter}", "0.5", "--admission", "off",
                                         "--ctx", "128", "--ctx-total", "1024", "-t", "2"])
    srv.start()
    try:
        srv.wait_ready()
        st, _, data = request(srv.port, "GET", "/v1/models")
        assert [x["id"] for x in json.loads(data)["data"]] == ["tiny", "tiny:ad", "tiny:half"], data
        names = ("tiny", "tiny:ad", "tiny:half")

        def complete(name):
            st, _, data = request(srv.port, "POST", "/v1/completions",
                                  {"model": name, "prompt": "abc", "max_tokens": 8, "temperature": 0})
            assert st == 200, (name, st, data[:200])
            body = json.loads(data)
            assert body["model"] == name, body
            return body["choices"][0]["text"]

        texts = {name: complete(name) for name in names}
        assert len(set(texts.values())) == 3, texts
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            together = list(pool.map(complete, [n for n in names for _ in range(2)]))
        assert together == [texts[n] for n in names for _ in range(2)], (together, texts)
        st, _, data = request(srv.port, "GET", "/metrics")
        pools = [ln for ln in data.decode().splitlines() if ln.startswith("metro_kv_blocks_capacity{")]
        assert len(pools) == 1, pools
        st, _, data = request(srv.port, "POST", "/v1/completions", {"model": "tiny:nope", "prompt": "abc"})
        assert st == 404, (st, data[:200])
    finally:
        srv.kill()
    for extra, want in ((["--lora", adapter], "write NAME=FILE"), (["--lora", f"bad={model}"], "not a LoRA adapter")):
        p = subprocess.run([ctx.metro, "serve", "-m", model] + extra + ["--port", "0"], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode != 0 and want in p.stderr, (extra, p.returncode, p.stderr[-300:])
    ctx.note(f"lora: base and two adapters in one engine answer differently, alone and at once: "
             f"{sorted(texts.values())}")


TESTS = [t_rollout_promotes_a_healthy_canary_and_rolls_a_failing_one_back, t_rollout_rolls_back_damaged_weights,
         t_breaker_faults_and_admin_api,
         t_hot_load_and_unload_under_load, t_feedback_rolls_back_a_disliked_canary, t_config_file,
         t_lora_adapters_share_the_base_engine]
