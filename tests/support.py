"""Helpers shared by the test suites.

``require_binary`` is the only sanctioned way to skip: a component that is genuinely absent on a
developer's machine is skipped there, but in CI (``CI`` set) its absence is a failure, because
``scripts/test`` installs it.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest


def require_binary(name: str, *extra_dirs: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([*extra_dirs, os.environ.get("PATH", "")]))
    if path:
        return path
    message = f"{name} is not installed (scripts/test installs it)"
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must not skip it")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
