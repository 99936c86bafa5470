"""Fixtures for the hypervisor clients: short socket dirs and a served cloud-hypervisor emulator."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.fakes.cloud_hypervisor import CloudHypervisorEmulator


@pytest.fixture
def sock_dir():
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="hv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def emulator():
    return CloudHypervisorEmulator(boot_vcpus=2, max_vcpus=4)


@pytest.fixture
async def ch_socket(emulator, sock_dir):
    async with emulator.serve(sock_dir / "ch.sock") as path:
        yield path


@pytest.fixture(autouse=True)
def _close_loop_opened_for_sync_tests(request):
    """Close the event loop looptime's plugin opens around *sync* tests.

    looptime 0.9 calls ``policy.get_event_loop()`` in ``pytest_pyfunc_call`` for every test that
    has pytest-asyncio's ``event_loop_policy`` fixture; for a sync test that creates a loop nobody
    closes, and its ResourceWarning later fails an unrelated test (filterwarnings=error). This
    belongs in a root conftest; it lives here until one exists.
    """
    yield
    if inspect.iscoroutinefunction(request.function):
        return
    policy = asyncio.get_event_loop_policy()
    try:
        loop = policy.get_event_loop()
    except RuntimeError:  # no loop, and the policy will not make one: nothing to close
        return
    if not loop.is_running():
        loop.close()
    policy.set_event_loop(None)
