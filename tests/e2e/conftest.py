"""End-to-end fixtures: the real binaries as child processes (``testkit.local_stack``).

The guest is booted once per module (about 7 s under TCG plus the image check) and shared by
its tests; every process is stopped in the fixtures' teardown, also when a test fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.local_stack import Guest, GuestImage, build_minimal_image, start_runner, wait_booted
from tests.support import require_binary


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    require_binary("qemu-system-x86_64")
    require_binary("apt-get")  # the image build extracts Debian packages
    require_binary("dpkg-deb")
    return build_minimal_image()


@pytest.fixture(scope="module")
def guest(guest_image: GuestImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    """The minimal guest, 4 vCPUs of which 1 is online at boot (the runner's default vCPU mode,
    online through QGA), node_exporter on a loopback port."""
    workdir = tmp_path_factory.mktemp("guest")
    guest = start_runner(guest_image, workdir, min_vcpus=1, max_vcpus=4)
    try:
        wait_booted(guest)
        yield guest
    finally:
        # Powerdown through ACPI (a few seconds), quit and SIGKILL after that: bounded.
        guest.runner.stop(timeout_seconds=30)
