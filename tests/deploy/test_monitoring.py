"""manifests/monitoring: the rules pass promtool and their unit tests, name only metrics the
code exports, come from one source; the dashboard's queries too; the component renders with
the base, and its RBAC grants the scraper exactly what the extender's metrics port checks.

promtool is Debian's (``prometheus``, installed by scripts/setup). Without it these tests
skip on a developer's machine and fail under CI (``CI`` set), as the node tier does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest
import yaml
from prometheus_client import CollectorRegistry

from autoscaler_agent.metrics import AgentMetrics
from protocol.virtualmachine import VirtualMachine
from scheduler_extender.kube.metrics_auth import METRICS_PATH
from scheduler_extender.metrics import Metrics
from testkit import prometheus, promql
from testkit.manifests import (
    EXAMPLES,
    MANIFESTS,
    MONITORING,
    PROMETHEUS_FILES,
    ROOT,
    find,
    pod_spec,
    render,
)
from vm_controller import decide

RULES = PROMETHEUS_FILES / "rules.yaml"
SCRAPE = PROMETHEUS_FILES / "scrape.yaml"
DASHBOARD = MONITORING / "dashboards" / "vm-autoscaling.json"
RULES_TEST = Path(__file__).parent / "monitoring" / "rules_test.yaml"
DEPLOY_MD = ROOT / "docs" / "DEPLOY.md"
# Metrics the rules read from other exporters: the guests' node_exporter.
FOREIGN = {"node_vmstat_oom_kill"}
KUBECTL = shutil.which("kubectl")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run promtool: install Debian's prometheus (scripts/setup)")
        pytest.skip("no promtool (Debian's prometheus package; scripts/setup installs it)")
    return path


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def exported() -> set[str]:
    """Every series name the extender and the agent can export (counters' ``_total``,
    histograms' ``_bucket``/``_sum``/``_count``), from their own metric definitions."""
    names: set[str] = set()
    registry = CollectorRegistry()
    Metrics(registry)
    AgentMetrics(registry)
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def _rules() -> list[dict]:
    return [r for g in prometheus.load(RULES)["groups"] for r in g["rules"]]


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


# --- one source, promtool ---------------------------------------------------------------


def test_the_prometheus_rule_is_what_the_rules_file_gives():
    result = _run(str(ROOT / ".venv" / "bin" / "python"), "scripts/monitoring.py", "--check",
                  cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    rule = yaml.safe_load((MONITORING / "operator" / "prometheusrule.yaml").read_text())
    assert rule["spec"]["groups"] == prometheus.load(RULES)["groups"]


def test_the_check_fails_on_a_stale_prometheus_rule(tmp_path, monkeypatch):
    """``--check`` is worth something only if a rule edited in one place fails it."""
    import runpy

    module = runpy.run_path(str(ROOT / "scripts" / "monitoring.py"))
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(module["render"](RULES.read_text().replace("for: 2m", "for: 3m")))
    main = module["main"]
    monkeypatch.setitem(main.__globals__, "PROMETHEUS_RULE", stale)
    assert main(["--check"]) == 1


def test_promtool_checks_the_rules():
    result = _run(_promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = _run(_promtool(), "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {r["alert"] for r in _rules()} == fired


def test_the_unit_tests_fail_on_a_broken_rule(tmp_path):
    """A rule that can no longer fire fails promtool's tests: they are not vacuous."""
    rules = prometheus.load(RULES)
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "VmAutoscalingGuestOomKills":
            rule["expr"] = "increase(node_vmstat_oom_kill[10m]) > 100"
    broken = tmp_path / "manifests" / "monitoring" / "prometheus"
    broken.mkdir(parents=True)
    (broken / "rules.yaml").write_text(yaml.safe_dump(rules))
    here = tmp_path / "tests" / "deploy" / "monitoring"
    here.mkdir(parents=True)
    shutil.copy(RULES_TEST, here / RULES_TEST.name)
    result = _run(_promtool(), "test", "rules", RULES_TEST.name, cwd=here)
    assert result.returncode == 1
    assert "VmAutoscalingGuestOomKills" in result.stdout + result.stderr


def test_the_tiers_file_sd_scrape_config_passes_promtool(tmp_path):
    """Debian's promtool has no kubernetes_sd_configs; the jobs the tier derives from the
    shipped ones (testkit/prometheus.py) must still be a valid configuration."""
    jobs = prometheus.file_sd_jobs(prometheus.load(SCRAPE)["scrape_configs"], tmp_path)
    for job in jobs:
        if "authorization" in job:
            token = tmp_path / "token"
            token.write_text("x")
            job["authorization"]["credentials_file"] = str(token)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": jobs, "rule_files": [str(RULES)]}))
    result = _run(_promtool(), "check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


# --- names: only what the code exports ---------------------------------------------------


def test_rules_and_panels_name_only_exported_metrics():
    known = exported() | FOREIGN
    queries = [(r["alert"], r["expr"]) for r in _rules()] + _dashboard_queries()
    unknown = {
        (where, name) for where, expr in queries for name in promql.metric_names(expr) - known
    }
    assert unknown == set()


def test_every_exported_name_used_is_read_and_foreign_ones_are_few():
    used = set().union(*(promql.metric_names(e) for _, e in _dashboard_queries()))
    assert "vmautoscale_agent_vm_load1" in used and "vmautoscale_extender_leading" in used
    assert set().union(*(promql.metric_names(r["expr"]) for r in _rules())) >= FOREIGN


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", "up"),
        ('rate(a_total{job="x",le=~"1|2"}[5m])', "a_total"),
        ("sum by (node, le) (rate(b[1h30m])) > on (node) group_left (vm) c", "b c"),
        ("histogram_quantile(0.99, sum without (pod) (rate(d[5m] offset 1m)))", "d"),
        ('label_replace(e, "r", "v", "", "") or f unless g and bool h', "e f g h"),
        ("max(i) by (j) - 1e3 + 0x1F * Inf", "i"),
        ("sum(k) # a comment naming not_a_metric\n / count(l)", "k l"),
        ("m:recorded:rate5m[5m:1m]", "m:recorded:rate5m"),
        ('n{path="/with \\"quoted\\" {braces}"}', "n"),
    ],
)
def test_metric_names_are_read_by_the_grammar(expr, names):
    assert promql.metric_names(expr) == set(names.split())


@pytest.mark.parametrize(
    "expr",
    ['{__name__="x"}', "rate(x[5q])", "x $ y", 'x{a="b}', "x{a='b'"],
    ids=["name-selector", "bad-unit", "unknown-char", "open-string", "open-brace"],
)
def test_unreadable_expressions_fail_loudly(expr):
    with pytest.raises(promql.PromqlError):
        promql.metric_names(expr)


def test_a_query_naming_an_unknown_metric_is_caught():
    names = promql.metric_names("sum(rate(vmautoscale_agent_resizes_totl[5m]))")
    assert names - exported() == {"vmautoscale_agent_resizes_totl"}


def test_windows_are_scaled_without_touching_the_rest():
    expr = 'increase(x_total{le="5m"}[5m]) > 0 unless y[1h:30s] offset 10m'
    assert (
        promql.scaled(expr, 30)
        == 'increase(x_total{le="5m"}[10s]) > 0 unless y[120s:1s] offset 20s'
    )
    rules = prometheus.scaled_rules(prometheus.load(RULES), for_divisor=60, window_divisor=10)
    scaled = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert scaled["VmAutoscalingNoExtenderLeading"]["for"] == "1s"
    assert "[30s]" in scaled["VmAutoscalingAgentCannotReachExtender"]["expr"]


# --- the component -----------------------------------------------------------------------


def _kustomize(directory: Path) -> list[dict]:
    if KUBECTL is None:
        if os.environ.get("CI"):
            pytest.fail("CI must render the component: kubectl (scripts/setup's dev extra)")
        pytest.skip("kubectl (with built-in kustomize) absent")
    result = _run(KUBECTL, "kustomize", str(directory))
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def with_monitoring(tmp_path_factory) -> list[dict]:
    """What a user applies: the base plus both components (kustomize wants relative paths)."""
    use = tmp_path_factory.mktemp("use")
    rel = os.path.relpath(MANIFESTS, use)
    (use / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {"resources": [rel], "components": [f"{rel}/monitoring", f"{rel}/monitoring/operator"]}
        )
    )
    return _kustomize(use)


def test_the_component_adds_its_objects_to_the_base(with_monitoring):
    kinds = {(d["kind"], d["metadata"]["name"]) for d in with_monitoring}
    base = {
        (d["kind"], d["metadata"]["name"]) for d in render(MANIFESTS) if d["kind"] != "ConfigMap"
    }
    assert base <= kinds
    assert {
        ("ServiceAccount", "vm-autoscaling-scraper"),
        ("Secret", "vm-autoscaling-scraper-token"),
        ("ConfigMap", "vm-autoscaling-dashboard"),
        ("ServiceMonitor", "scheduler-extender"),
        ("PodMonitor", "autoscaler-agent"),
        ("PodMonitor", "vm-guests"),
        ("PrometheusRule", "vm-autoscaling"),
    } <= kinds
    dashboard = find(with_monitoring, "ConfigMap", "vm-autoscaling-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["vm-autoscaling.json"]) == json.loads(DASHBOARD.read_text())
    for doc in with_monitoring:
        if (doc["kind"], doc["metadata"]["name"]) in base:
            continue
        if doc["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
            assert doc["metadata"]["namespace"] == "vm-autoscaling", doc["metadata"]["name"]


def _rules_of(docs: list[dict], subject: tuple[str, str]) -> list[dict]:
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] == "ClusterRole"}
    rules = []
    for b in docs:
        if b["kind"] in {"ClusterRoleBinding", "RoleBinding"} and any(
            (s["kind"], s.get("namespace"), s["name"]) == ("ServiceAccount", *subject)
            for s in b["subjects"]
        ):
            assert b["roleRef"]["kind"] == "ClusterRole", b["metadata"]["name"]
            rules.extend(roles[("ClusterRole", b["roleRef"]["name"])]["rules"])
    return rules


def test_the_scraper_may_get_metrics_and_discover_pods_and_nothing_else(with_monitoring):
    rules = _rules_of(with_monitoring, ("vm-autoscaling", "vm-autoscaling-scraper"))
    # What DelegatedMetricsAuth asks the SubjectAccessReview, and what role pod lists.
    assert sorted(rules, key=str) == sorted(
        [
            {"nonResourceURLs": [METRICS_PATH], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        ],
        key=str,
    )
    secret = find(with_monitoring, "Secret", "vm-autoscaling-scraper-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == (
        "vm-autoscaling-scraper"
    )


def _container_ports(docs: list[dict], kind: str, name: str) -> set[str]:
    spec = pod_spec(find(docs, kind, name))
    return {p["name"] for c in spec["containers"] for p in c.get("ports", [])}


def test_scrape_jobs_and_monitors_keep_ports_the_pods_have(with_monitoring):
    """The names in the scrape config's keep rules and in the monitors are real port names."""
    jobs = {j["job_name"]: j for j in prometheus.load(SCRAPE)["scrape_configs"]}
    keep = {name: j["relabel_configs"][0]["regex"].split(";")[1] for name, j in jobs.items()}
    extender = _container_ports(with_monitoring, "Deployment", "scheduler-extender")
    agent = _container_ports(with_monitoring, "DaemonSet", "autoscaler-agent")
    (example,) = render(EXAMPLES)
    made = decide.desired_pod(msgspec.convert(example, VirtualMachine))  # the vm-controller's
    vm = {p["name"] for c in made["spec"]["containers"] for p in c.get("ports", [])}
    assert keep == {
        "vm-autoscaling-extender": "metrics",
        "vm-autoscaling-agent": "http",
        "vm-autoscaling-guests": "node-exporter",
    }
    assert {"metrics"} <= extender and {"http"} <= agent and {"node-exporter"} <= vm
    # Only the extender's port checks a token, and both ways of scraping send it there only.
    assert [n for n, j in jobs.items() if "authorization" in j] == ["vm-autoscaling-extender"]
    sm = find(with_monitoring, "ServiceMonitor", "scheduler-extender")
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["authorization"]["credentials"]["name"] == "vm-autoscaling-scraper-token"
    service = find(with_monitoring, "Service", "scheduler-extender-metrics")
    assert {p["name"] for p in service["spec"]["ports"]} == {"metrics"}
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {
        d["metadata"]["name"]: d["spec"]["podMetricsEndpoints"][0]["port"]
        for d in with_monitoring
        if d["kind"] == "PodMonitor"
    }
    assert ports == {"autoscaler-agent": "http", "vm-guests": "node-exporter"}
    for d in with_monitoring:
        if d["kind"] == "PodMonitor":
            assert "authorization" not in d["spec"]["podMetricsEndpoints"][0]


# --- the runbook -------------------------------------------------------------------------


def test_every_alert_has_runbook_lines_in_deploy_md():
    text = DEPLOY_MD.read_text()
    section = text[text.index("### Alerts") :]
    for rule in _rules():
        heading = f"#### {rule['alert']}"
        assert heading in section, heading
        body = section[section.index(heading) + len(heading) :].split("####", 1)[0]
        for part in ("Means:", "Look at:", "Do:"):
            assert part in body, f"{rule['alert']}: no {part!r}"
