"""Suite-wide fixtures."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import settings

# CI runs the same examples every time (a red CI must be reproducible from its log, and a green
# one must not depend on luck); developers' runs stay random and keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench",
        action="store_true",
        help="run the benchmarks' runs (tests marked bench) and nothing else; without it (or"
        " --with-bench) they are deselected",
    )
    parser.addoption(
        "--with-bench",
        action="store_true",
        help="run the benchmarks' runs with the suite, on its workers (scripts/test's first step)",
    )
    parser.addoption(
        "--node",
        action="store_true",
        help="run the real-node tier (tests marked node: a kubelet on containerd, as root) and"
        " nothing else; without it they are deselected (CI runs it after scripts/test)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Benchmarks are kept apart from the tests (their runs take minutes and check the scripts
    more than the product): ``--bench`` runs them alone, the default run leaves them out,
    ``--with-bench`` runs them with the suite. The real-node tier (minutes, and root) runs
    only with ``--node``, alone.

    ``tryfirst``: pytest-xdist reads the ``xdist_group`` marks in its own hook of this name, on
    each worker; a mark added after it is ignored, and without its groups both workers started
    a control plane and booted guests side by side."""
    bench = bool(config.getoption("--bench"))
    with_bench = bool(config.getoption("--with-bench"))
    node = bool(config.getoption("--node"))
    keep, drop = [], []
    for item in items:
        is_bench = item.get_closest_marker("bench") is not None
        wanted = (is_bench == bench or with_bench) and (
            item.get_closest_marker("node") is not None
        ) == node
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # With parallel workers (pytest-xdist, --dist loadgroup): the real control plane (the
    # session's ``control_plane`` fixture) is started once per worker that needs it, so every
    # test that uses it, wherever it lives, stays on one worker; the guests share two cores, so
    # the QEMU tier stays on one too, but for its longest tests (marked ``qemu_apart``): in it,
    # they made it the step's critical path while the other worker sat idle. They run beside
    # it, one guest per worker (image builds are one at a time, under a file lock).
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            parts = item.path.parts
            if "controlplane" in parts or "control_plane" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group("controlplane"))
            elif item.get_closest_marker("qemu_apart"):
                item.add_marker(pytest.mark.xdist_group("qemu-apart"))
            elif item.get_closest_marker("qemu") or "e2e" in parts or "vm" in parts:
                item.add_marker(pytest.mark.xdist_group("qemu"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> object:
    """Close the event loop looptime's plugin opens around *sync* tests.

    looptime 0.9 calls ``policy.get_event_loop()`` in its ``pytest_pyfunc_call`` for every test
    that has pytest-asyncio's ``event_loop_policy`` fixture; for a sync test that creates a loop
    nobody closes, and its ResourceWarning later fails an unrelated test (filterwarnings=error).
    This wrapper runs inside looptime's (trylast), so it sees that loop before the test runs:
    after it, the loop is closed even when the test replaced it (a ``main()`` that calls
    ``asyncio.run`` leaves no loop set at all).
    """
    if pyfuncitem.get_closest_marker("asyncio") is not None:  # pytest-asyncio runs it
        return (yield)
    policy = asyncio.get_event_loop_policy()
    try:
        opened = policy.get_event_loop()
    except RuntimeError:  # no loop, and the policy will not make one: nothing to close
        opened = None
    try:
        return (yield)
    finally:
        if opened is not None and not opened.is_running():
            opened.close()
        policy.set_event_loop(None)


@pytest.fixture(autouse=True)
def _restore_structlog_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo a ``configure_logging`` done by an in-process ``main()`` test, and keep it from
    caching loggers meanwhile.

    The binaries configure structlog with ``cache_logger_on_first_use``: a module's logger
    first used under that configuration (an in-process ``main`` that logs as it starts) would
    keep it for good, and slip past ``structlog.testing.capture_logs`` in every later test;
    restoring the configuration does not undo a cached logger. So while a test runs no
    configuration caches (a speed-up only), and after it the suite's configuration is back.
    """
    saved = structlog.get_config()
    configure = structlog.configure

    def configure_uncached(*args: Any, **kwargs: Any) -> None:
        configure(*args, **{**kwargs, "cache_logger_on_first_use": False})

    monkeypatch.setattr(structlog, "configure", configure_uncached)
    yield
    configure(**saved)
