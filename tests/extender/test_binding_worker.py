"""The binding worker is a transport: across its channel a bind ends as it does in process.

The worker's side (``serve_binds``) runs in this process on its own API client, over a
socketpair to the extender's ``BindingWorker``, as ``serve`` runs them in two processes. What
bind decides is tested in process (test_bind.py); here: the Binding the worker sends is the
one the extender would have sent, the API's refusal comes back as the same error, and a
worker gone with a Binding in flight releases the reservation, after which the extender sends
Bindings itself. The real two processes run in the control-plane tier.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from kube_io.client import KubeClient
from scheduler_extender.channel import Channel
from scheduler_extender.kube.binding_worker import FRAMES, BindingWorker, serve_binds
from testkit.kube_api import FakeKubeApi, node_object
from tests.extender.conftest import Running, launch, wait_until
from tests.extender.helpers import bind_body, vm_pod

BINDING = "/api/v1/namespaces/vms/pods/{}/binding"


@dataclass
class Worker:
    """The worker's side in this process: the names it was asked to bind, and a gate that
    holds its Bindings back while cleared."""

    asked: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    stop: Callable[[], Awaitable[None]] | None = None


@pytest.fixture
async def worker_and_extender(
    kube_api: FakeKubeApi, aiohttp_client: Any
) -> AsyncIterator[tuple[Worker, Running]]:
    cleanups: list[Callable[[], Awaitable[None]]] = []
    kube_api.add_node(node_object("node-a", cpu="4"))
    worker = Worker()
    worker.gate.set()
    bindings = BindingWorker(kubeconfig=None, user_agent="test", log_level="info")
    ours, theirs = socket.socketpair()
    client = KubeClient.for_url(kube_api.url)

    async def bind_pod(namespace: str, name: str, **kwargs: Any) -> None:
        worker.asked.append(name)
        await worker.gate.wait()
        await client.bind_pod(namespace, name, **kwargs)

    worker_channel = await Channel.open(theirs, FRAMES)
    serving = asyncio.create_task(serve_binds(worker_channel, bind_pod))
    main_channel = await Channel.open(ours, FRAMES)
    reading = bindings.attach(main_channel)

    async def stop_worker() -> None:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await worker_channel.close()
        await asyncio.gather(reading, return_exceptions=True)
        await main_channel.close()

    worker.stop = stop_worker
    running = await launch(kube_api, aiohttp_client, cleanups, bindings=bindings)
    yield worker, running
    for cleanup in reversed(cleanups):
        await cleanup()
    await stop_worker()
    await client.close()


async def test_the_worker_sends_the_binding_the_extender_decided(
    kube_api: FakeKubeApi, worker_and_extender: tuple[Worker, Running]
) -> None:
    worker, running = worker_and_extender
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1", min_vcpus=2))
    await wait_until(lambda: "vms/vm-1" in running.extender.unbound)
    response = await running.verbs.post("/bind", json=bind_body(pod, "node-a"))
    assert (response.status, await response.json()) == (200, {"Error": ""})
    assert worker.asked == ["vm-1"]
    (binding,) = [r for r in kube_api.requests if r.path == BINDING.format("vm-1")]
    assert binding.body["metadata"]["uid"] == "u-1"  # the UID precondition
    assert binding.body["target"]["name"] == "node-a"
    await wait_until(lambda: not running.extender.ledger.pods["u-1"].is_tentative)


async def test_the_apis_refusal_comes_back_and_releases_the_reservation(
    kube_api: FakeKubeApi, worker_and_extender: tuple[Worker, Running]
) -> None:
    worker, running = worker_and_extender
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    await wait_until(lambda: "vms/vm-1" in running.extender.unbound)
    before = await running.state()
    kube_api.fail_next(409, path=BINDING.format("vm-1"), message="pod vm-1 already assigned")
    response = await running.verbs.post("/bind", json=bind_body(pod, "node-a"))
    error = (await response.json())["Error"]
    assert worker.asked == ["vm-1"]
    assert error == "binding vms/vm-1 to node-a failed: pod vm-1 already assigned"
    assert await running.state() == before
    running.extender.ledger.check_invariants()


async def test_a_worker_gone_mid_binding_releases_it_and_the_extender_binds_itself(
    kube_api: FakeKubeApi, worker_and_extender: tuple[Worker, Running]
) -> None:
    worker, running = worker_and_extender
    pod = kube_api.add_pod(vm_pod("vm-1", uid="u-1"))
    await wait_until(lambda: "vms/vm-1" in running.extender.unbound)
    before = await running.state()
    worker.gate.clear()  # the worker holds the Binding back...
    answer = asyncio.create_task(running.verbs.post("/bind", json=bind_body(pod, "node-a")))
    await wait_until(lambda: worker.asked == ["vm-1"])
    assert "u-1" in running.extender.ledger.pods  # reserved while the Binding is out
    assert worker.stop is not None
    await worker.stop()  # ...and is gone before sending it
    error = (await (await answer).json())["Error"]
    assert error.startswith("binding vms/vm-1 to node-a failed: the binding worker exited")
    assert await running.state() == before
    assert not [r for r in kube_api.requests if r.path == BINDING.format("vm-1")]
    # No worker: the next bind's Binding goes out on the extender's own client.
    response = await running.verbs.post("/bind", json=bind_body(pod, "node-a"))
    assert (response.status, await response.json()) == (200, {"Error": ""})
    assert worker.asked == ["vm-1"]
    assert [r for r in kube_api.requests if r.path == BINDING.format("vm-1")]
