"""The real kustomize (built into kubectl) renders what testkit/manifests.py says it does.

kubectl is not installed by scripts/setup; where it is absent the Python renderer alone is
checked (test_manifests.py), so these tests skip rather than fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from testkit.manifests import EXAMPLES, KUSTOMIZATION_DIRS, MANIFESTS, render

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with built-in kustomize) absent")


def _kustomize(directory) -> list[dict]:
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _unhash(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def _normalise(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """Strip the generated ConfigMaps' content hash, everywhere it is referenced too."""
    out = {}
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["metadata"]["name"] = _unhash(doc["metadata"]["name"])
        for workload_kind in ("Deployment", "DaemonSet"):
            if doc["kind"] == workload_kind:
                for vol in doc["spec"]["template"]["spec"].get("volumes", []):
                    if "configMap" in vol:
                        vol["configMap"]["name"] = _unhash(vol["configMap"]["name"])
        out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=str)
def test_kubectl_kustomize_agrees_with_the_python_renderer(directory):
    assert _normalise(_kustomize(directory)) == _normalise(render(directory))


def test_config_changes_roll_the_pods():
    """Generated names carry a content hash, so a new config is a new pod template."""
    names = [d["metadata"]["name"] for d in _kustomize(MANIFESTS) if d["kind"] == "ConfigMap"]
    assert len(names) == 3
    assert all(re.search(r"-[a-z0-9]{10}$", n) for n in names)


def test_kvm_component_adds_the_device_to_the_statefulset_example(tmp_path):
    # Kustomize refuses absolute paths, so build a kustomization beside a copy of the examples.
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    (tmp_path / "use").mkdir()
    (tmp_path / "use" / "kustomization.yaml").write_text(
        "resources: [../examples/statefulset]\ncomponents: [../examples/kvm]\n"
    )
    vms = [d for d in _kustomize(tmp_path / "use") if d["kind"] == "StatefulSet"]
    assert len(vms) == 1
    for vm in vms:
        spec = vm["spec"]["template"]["spec"]
        assert {"name": "kvm", "hostPath": {"path": "/dev/kvm", "type": "CharDevice"}} in spec[
            "volumes"
        ]
        (c,) = spec["containers"]
        assert "--kvm-boots" in c["args"]
        assert {"name": "kvm", "mountPath": "/dev/kvm"} in c["volumeMounts"]
