"""The deployment files under deploy/ against the binary and the server they deploy: every
flag they pass is one `metro serve` takes, the probes and signals are the ones metro
answers, and every metric the Grafana dashboard and the alerting rules query is one /metrics
exports (the rules also pass promtool's check and their unit tests)."""

import configparser
import json
import os
import re
import shlex
import subprocess
import time

import yaml

from e2e_util import promtool, request, wait_listening

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _serve_flags(metro, command="serve"):
    out = subprocess.run([metro, command, "--help"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out)) | set(re.findall(r"\s(-[a-zA-Z])[\s,]", out))


def _check_args(args, flags, where, command="serve"):
    assert args[0] == command, (where, args)
    for a in args[1:]:
        if a.startswith("-"):
            assert a in flags, (where, a)
    drain = args[args.index("--drain-timeout") + 1] if "--drain-timeout" in args else "30"
    return float(drain)


def t_deploy_files(t):
    flags = _serve_flags(t.metro)
    assert "--drain-timeout" in flags and "--log-format" in flags, sorted(flags)

    # Dockerfile: a non-root user, a health check on /health, metro as the entry point.
    docker = open(os.path.join(ROOT, "deploy", "Dockerfile")).read()
    joined = docker.replace("\\\n", " ")
    user = re.search(r"^USER\s+(\S+)", joined, re.M).group(1)
    assert user.split(":")[0] not in ("0", "root"), user
    assert re.search(r"^HEALTHCHECK .*http://127\.0\.0\.1:8080/health", joined, re.M), "HEALTHCHECK"
    assert re.search(r'^ENTRYPOINT \["metro"\]', joined, re.M)
    _check_args(json.loads(re.search(r"^CMD (\[.*\])", joined, re.M).group(1)), flags, "Dockerfile CMD")

    # systemd: SIGTERM, and more time to stop than the drain takes.
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(os.path.join(ROOT, "deploy", "metro.service"))
    svc = unit["Service"]
    assert svc["KillSignal"] == "SIGTERM"
    exec_args = shlex.split(svc["ExecStart"])
    assert os.path.basename(exec_args[0]) == "metro"
    drain = _check_args(exec_args[1:], flags, "ExecStart")
    assert float(svc["TimeoutStopSec"]) > drain

    # Kubernetes: probes on /health and /ready, a drain that fits the grace period, a
    # Service that selects the pods, an HPA on a metric metro exports.
    docs = []
    for name in ("deployment.yaml", "service.yaml", "hpa.yaml"):
        with open(os.path.join(ROOT, "deploy", "k8s", name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    by_kind = {d["kind"]: d for d in docs}
    dep = by_kind["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    drain = _check_args(c["args"], flags, "Deployment args")
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["lifecycle"]["preStop"]
    assert pod["terminationGracePeriodSeconds"] > drain
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["resources"]["requests"]["memory"] and c["resources"]["requests"]["cpu"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind["Service"]["spec"]["selector"].items() <= labels.items()
    hpa = by_kind["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    hpa_metrics = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}

    # What /metrics declares (# TYPE lines), with a little traffic behind it.
    request(t.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, t.auth)
    st, _, body = request(t.port, "GET", "/metrics", timeout=30)
    assert st == 200
    families = set(re.findall(r"^# TYPE (\S+) ", body.decode(), re.M))
    assert hpa_metrics <= families, hpa_metrics - families
    dash = json.load(open(os.path.join(ROOT, "deploy", "grafana", "metro.json")))
    exprs = [tg["expr"] for p in dash["panels"] for tg in p["targets"]]
    assert len(exprs) >= 15, len(exprs)
    used = set()
    for e in exprs:
        for name in re.findall(r"\b((?:metro|process)_[a-z0-9_]+)", e):
            used.add(re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name)
    missing = used - families
    assert not missing, f"the dashboard queries metrics /metrics does not declare: {sorted(missing)}"
    t.note(f"deploy: {len(exprs)} dashboard queries over {len(used)} metric families, all exported")

    # Alerting rules: valid for Prometheus, raising what their unit tests expect, over
    # families /metrics declares.
    rules_dir = os.path.join(ROOT, "deploy", "prometheus")
    promtool("check", "rules", os.path.join(rules_dir, "alerts.yml"))
    promtool("test", "rules", os.path.join(rules_dir, "alerts_test.yml"))
    with open(os.path.join(rules_dir, "alerts.yml")) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    used = set()
    for r in rules:
        for name in re.findall(r"\b((?:metro|process)_[a-z0-9_]+)", r["expr"]):
            used.add(re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name)
    missing = used - families
    assert not missing, f"the alerting rules use metrics /metrics does not declare: {sorted(missing)}"
    t.note(f"deploy: {len(rules)} alerting rules over {len(used)} metric families, promtool check and test pass")


def t_router_deploy_files(t):
    """deploy/k8s/router.yaml and inferencepool.yaml: the router's --upstream and
    --kv-events lists name exactly the StatefulSet's pods through its headless Service
    (the events on the port each replica publishes), every flag is one the
    command takes, the Services and the pool select the pods they mean."""
    serve_flags = _serve_flags(t.metro)
    router_flags = _serve_flags(t.metro, "router")
    with open(os.path.join(ROOT, "deploy", "k8s", "router.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sts = by[("StatefulSet", "metro-replica")]
    headless = by[("Service", sts["spec"]["serviceName"])]
    router = by[("Deployment", "metro-router")]
    router_svc = by[("Service", "metro-router")]

    # The replicas: metro serve with valid flags, the vllm: series on, probes, drain.
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    drain = _check_args(c["args"], serve_flags, "StatefulSet args")
    assert c["args"][c["args"].index("--metrics-compat") + 1] == "vllm"
    assert pod["terminationGracePeriodSeconds"] > drain
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= labels.items()
    port = c["ports"][0]["containerPort"]

    # The router: valid flags, one --upstream per replica pod, by its stable DNS name.
    rc = router["spec"]["template"]["spec"]["containers"][0]
    args = rc["args"]
    _check_args(args, router_flags, "router args", command="router")
    upstreams = [args[i + 1] for i, a in enumerate(args) if a == "--upstream"]
    name, svc = sts["metadata"]["name"], headless["metadata"]["name"]
    want = [f"http://{name}-{i}.{svc}:{port}" for i in range(sts["spec"]["replicas"])]
    assert upstreams == want, (upstreams, want)
    # Its KV-event subscriptions: each replica's published port, in --upstream order.
    ev_port = int(c["args"][c["args"].index("--kv-events") + 1].rsplit(":", 1)[1])
    assert {"name": "kv-events", "containerPort": ev_port} in c["ports"], c["ports"]
    assert any(p["port"] == ev_port for p in headless["spec"]["ports"]), headless["spec"]["ports"]
    events = [args[i + 1] for i, a in enumerate(args) if a == "--kv-events"]
    assert events == [f"tcp://{name}-{i}.{svc}:{ev_port}" for i in range(sts["spec"]["replicas"])], events
    assert "tcpSocket" in rc["livenessProbe"], "the router's /health is 503 without replicas: not a liveness check"
    assert rc["readinessProbe"]["httpGet"]["path"] == "/health"
    r_port = int(args[args.index("--port") + 1])
    assert rc["ports"][0]["containerPort"] == r_port
    r_labels = router["spec"]["template"]["metadata"]["labels"]
    assert router["spec"]["selector"]["matchLabels"].items() <= r_labels.items()
    assert router_svc["spec"]["selector"].items() <= r_labels.items()

    # The router really starts with these arguments and answers the probe path: the
    # replicas' names do not resolve here, so once its health checks have run it reports
    # none healthy (503: not ready).
    local = list(args)
    local[local.index("--host") + 1] = "127.0.0.1"
    local[local.index("--port") + 1] = "0"
    proc = subprocess.Popen([t.metro] + local, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        local_port = wait_listening(proc, [], 30, "metro router")
        deadline = time.time() + 30
        while True:
            st, _, body = request(local_port, "GET", "/health", timeout=10)
            if st == 503 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert st == 503 and json.loads(body)["replicas"] == len(want), (st, body)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    # The Inference Extension pool: the replica pods, on their serving port.
    with open(os.path.join(ROOT, "deploy", "k8s", "inferencepool.yaml")) as f:
        pool = next(d for d in yaml.safe_load_all(f) if d)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [port]
    assert pool["spec"]["endpointPickerRef"]["name"] and pool["spec"]["endpointPickerRef"]["port"]["number"]
    t.note(f"deploy: router over {len(want)} replicas, pool on port {port}")


TESTS = [t_deploy_files, t_router_deploy_files]
