"""Fixtures for the kube_io tests: a started fake API server, a client for it, and the samples."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from kube_io import KubeClient
from testkit.kube_api import FakeKubeApi
from tests.fakes_paths import REFERENCE

SAMPLES = REFERENCE / "kube" / "api"


def sample_bytes(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def sample_answer(name: str) -> tuple[int, bytes]:
    """A ``.txt`` sample: its body and the ``HTTP NNN`` status written after it."""
    text = sample_bytes(name)
    match = re.search(rb"\n\s*HTTP (\d{3})\s*$", text)
    assert match, f"{name} has no trailing HTTP status"
    return int(match.group(1)), text[: match.start()].strip()


@pytest.fixture
async def kube_api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as api:
        yield api


@pytest.fixture
async def client(kube_api: FakeKubeApi) -> AsyncIterator[KubeClient]:
    kube = KubeClient.for_url(kube_api.url)
    yield kube
    await kube.close()
