"""Fixtures for the hypervisor clients: short socket dirs and a served cloud-hypervisor emulator."""

from __future__ import annotations

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
