"""A real Prometheus for the tests, configured from the files users get (manifests/monitoring).

Two departures from those files, both written here and nowhere else:

- Debian's ``prometheus`` (the binary the tests run) is built without Kubernetes service
  discovery (``kubernetes_sd_configs`` is an unknown field to it and to its promtool). So
  ``file_sd_jobs`` turns each shipped job into a ``file_sd_configs`` job and ``pod_targets``
  writes what ``kubernetes_sd_configs`` (role ``pod``) would have found: one target per
  container port, with the same ``__meta_kubernetes_*`` labels (upstream
  ``discovery/kubernetes/pod.go``). The shipped ``relabel_configs``, ``authorization`` and
  ``honor_labels`` are kept as they are, so the real Prometheus still decides which targets
  to keep and how to label them, and the tests list the pods with the scraper's own token.
- ``scaled_rules``: the same rules with their ``for`` and range windows divided, so that an
  alert a cluster would raise after minutes is raised within seconds of its cause.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from testkit import promql

Obj = dict[str, Any]


def sanitize(name: str) -> str:
    """Prometheus's ``strutil.SanitizeLabelName``: every character not in [a-zA-Z0-9_]
    becomes ``_``."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


def pod_targets(pods: Iterable[Obj]) -> list[tuple[str, dict[str, str], str]]:
    """``(namespace, labels, address)`` per container port of each pod with an IP."""
    out = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            continue
        base = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
        }
        for key, value in (meta.get("labels") or {}).items():
            base[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
            base[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        for container in spec["containers"]:
            for port in container.get("ports") or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }
                out.append((meta["namespace"], labels, f"{ip}:{port['containerPort']}"))
    return out


def _namespaces(job: Obj) -> set[str] | None:
    (sd,) = job["kubernetes_sd_configs"]
    if sd.get("role") != "pod":
        raise AssertionError(f"{job['job_name']}: only role pod is emulated, not {sd.get('role')}")
    names = sd.get("namespaces", {}).get("names")
    return set(names) if names else None


def file_sd_jobs(scrape_configs: list[Obj], sd_dir: Path) -> list[Obj]:
    """The shipped jobs, discovering through ``sd_dir/<job>.json`` (see ``write_targets``)."""
    jobs = []
    for shipped in scrape_configs:
        _namespaces(shipped)
        job = copy.deepcopy(shipped)
        del job["kubernetes_sd_configs"]
        job["file_sd_configs"] = [
            {"files": [str(sd_dir / f"{job['job_name']}.json")], "refresh_interval": "1s"}
        ]
        jobs.append(job)
    return jobs


def write_targets(scrape_configs: list[Obj], pods: list[Obj], sd_dir: Path) -> None:
    """Each job's file: the pods its namespaces hold, as ``kubernetes_sd_configs`` sees them.
    Written whole and renamed into place, so Prometheus never reads half a file."""
    targets = pod_targets(pods)
    for job in scrape_configs:
        namespaces = _namespaces(job)
        groups = [
            {"targets": [address], "labels": labels}
            for namespace, labels, address in targets
            if namespaces is None or namespace in namespaces
        ]
        path = sd_dir / f"{job['job_name']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, sort_keys=True))
        tmp.replace(path)


def scaled_rules(rules: Obj, *, for_divisor: float, window_divisor: float) -> Obj:
    """``rules`` with every ``for`` divided by ``for_divisor`` and every range window or offset
    in the expressions by ``window_divisor``."""
    out = copy.deepcopy(rules)
    for group in out["groups"]:
        for rule in group["rules"]:
            rule["expr"] = promql.scaled(rule["expr"], window_divisor)
            if "for" in rule:
                rule["for"] = promql.duration_text(promql.seconds(rule["for"]) / for_divisor)
    return out


def load(path: Path) -> Obj:
    doc: Obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc
