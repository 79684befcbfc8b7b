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

import yaml

from e2e_util import promtool, request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _serve_flags(metro):
    out = subprocess.run([metro, "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out)) | set(re.findall(r"\s(-[a-zA-Z])[\s,]", out))


def _check_args(args, flags, where):
    assert args[0] == "serve", (where, args)
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


TESTS = [t_deploy_files]
