"""Reading the deployment files the way ``kubectl apply -k`` would, without a cluster.

``render(dir)`` implements the subset of kustomize these kustomizations use: ``resources``
(files and directories), ``labels`` (``includeSelectors: false``: metadata only) and
``configMapGenerator`` with ``files`` (names without the content hash; the references in pod
specs keep the unhashed name, exactly what kustomize rewrites). Anything else in a
kustomization is an error here, so a new feature cannot slip in untested.
``tests/deploy/test_kustomize.py`` compares this with the real ``kubectl kustomize``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
VM_CONTROLLER = MANIFESTS / "vm-controller"
# The example VM as a hand-written StatefulSet: the form for clusters without the vm-controller.
STATEFULSET_EXAMPLE = EXAMPLES / "statefulset"
KUSTOMIZATION_DIRS = (MANIFESTS, EXAMPLES, EXAMPLES / "double", VM_CONTROLLER, STATEFULSET_EXAMPLE)
KNOWN_KEYS = {"apiVersion", "kind", "resources", "labels", "configMapGenerator", "components"}

Doc = dict[str, Any]


def load_yaml_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def kustomization(directory: Path) -> Doc:
    doc: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(doc) - KNOWN_KEYS
    if unknown:
        raise AssertionError(f"{directory}: kustomization keys this renderer lacks: {unknown}")
    return doc


def render(directory: Path) -> list[Doc]:
    k = kustomization(directory)
    if k.get("kind") == "Component":
        raise AssertionError(f"{directory} is a Component; render a kustomization using it")
    docs: list[Doc] = []
    for entry in k.get("resources", []):
        path = directory / entry
        if path.is_dir():
            docs.extend(render(path))
        else:
            docs.extend(load_yaml_docs(path))
    for gen in k.get("configMapGenerator", []):
        data = {}
        for spec in gen["files"]:
            key, _, rel = spec.partition("=")
            data[key] = (directory / (rel or key)).read_text(encoding="utf-8")
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"], "namespace": gen["namespace"]},
                "data": data,
            }
        )
    for label_set in k.get("labels", []):
        if label_set.get("includeSelectors", False):
            raise AssertionError("includeSelectors would change immutable selectors")
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(label_set["pairs"])
    return docs


MONITORING = MANIFESTS / "monitoring"
# Prometheus's own files (a rules file, scrape jobs), not Kubernetes objects.
PROMETHEUS_FILES = MONITORING / "prometheus"


def all_manifest_files() -> Iterator[Path]:
    """Every YAML file that holds Kubernetes objects (not kustomizations, not config files,
    not Prometheus's own files)."""
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        parts = path.relative_to(MANIFESTS).parts
        if path.name == "kustomization.yaml" or "config" in parts:
            continue
        if path.is_relative_to(PROMETHEUS_FILES):
            continue
        yield path


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Doc, name: str) -> Doc:
    matches = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(matches) == 1, f"no container {name}"
    found: Doc = matches[0]
    return found


def volume(workload: Doc, name: str) -> Doc:
    matches = [v for v in pod_spec(workload)["volumes"] if v["name"] == name]
    assert len(matches) == 1, f"no volume {name}"
    found: Doc = matches[0]
    return found


def mount(c: Doc, volume_name: str) -> Doc:
    matches = [m for m in c.get("volumeMounts", []) if m["name"] == volume_name]
    assert len(matches) == 1, f"container {c['name']} does not mount {volume_name}"
    found: Doc = matches[0]
    return found


def config_file(docs: list[Doc], workload: Doc, container_name: str, path: str) -> str:
    """The text a container sees at ``path``, through a configMap volume."""
    c = container(workload, container_name)
    for m in c.get("volumeMounts", []):
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            vol = volume(workload, m["name"])
            cm = find(docs, "ConfigMap", vol["configMap"]["name"])
            text: str = cm["data"][path.removeprefix(prefix)]
            return text
    raise AssertionError(f"{container_name} has no mount that provides {path}")


def arg_value(args: list[str], flag: str) -> str:
    """``--flag=value`` or ``--flag value`` from an argv list."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {args}")
