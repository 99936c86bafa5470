"""Helpers shared by the test suites.

``require_binary`` is the only sanctioned way to skip: a component that is genuinely absent on a
developer's machine is skipped there, but in CI (``CI`` set) its absence is a failure, because
``scripts/test`` installs it. ``pod_info`` builds the extender's view of a pod for the pure
cores' tests.
"""

from __future__ import annotations

import os
import shutil

import pytest

from protocol.annotations import VmSpec
from scheduler_extender.core.podinfo import Demand, PodInfo


def require_binary(name: str, *extra_dirs: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([*extra_dirs, os.environ.get("PATH", "")]))
    if path:
        return path
    message = f"{name} is not installed (scripts/test installs it)"
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must not skip it")
    pytest.skip(message)


def pod_info(
    uid: str,
    *,
    requests: Demand,
    node: str | None = None,
    vm: VmSpec | None = None,
    namespace: str = "ns",
    permitted_memory: int | None = None,
) -> PodInfo:
    """A pod as the extender sees it: a VM of ours when ``vm`` is given, else a foreign pod."""
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=uid,
        node_name=node,
        scheduler_name="vm-scheduler" if vm is not None else "default-scheduler",
        requests=requests,
        priority=0,
        is_ours=vm is not None,
        is_vm=vm is not None,
        is_static=False,
        is_terminated=False,
        vm=vm,
        permitted_memory_bytes=permitted_memory,
    )
