"""Fixtures for the agent's shell tests: a world of fakes over real loopback HTTP."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from autoscaler_agent.core import CoreConfig
from autoscaler_agent.discovery import VmTarget
from autoscaler_agent.extender_client import ExtenderClient, PermitBatcher, TokenFile
from autoscaler_agent.memory_policy import MemoryPolicyConfig
from autoscaler_agent.metrics import AgentMetrics
from autoscaler_agent.policy import PolicyConfig
from autoscaler_agent.runner import RunnerDeps, Supervisor, VmLoops
from protocol.annotations import VmSpec
from testkit.agent_fakes import FakeExtender, FakeHypervisor, SyntheticMetrics, serving

NODE = "node-a"
TOKEN = "s3cret-token"
GiB = 2**30
BATCH_WINDOW_SECONDS = 0.005


async def eventually(predicate: Callable[[], bool], *, within_seconds: float = 3.0) -> None:
    """Poll ``predicate``: the fakes have no change events to wait on, and 10 ms is cheap."""
    async with asyncio.timeout(within_seconds):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


class World:
    def __init__(self, *, extender, metrics_app, metrics_base, supervisor, deps, batcher, tmp_path):
        self.extender: FakeExtender = extender
        self.metrics_app: SyntheticMetrics = metrics_app
        self.metrics_base: str = metrics_base
        self.supervisor: Supervisor = supervisor
        self.deps: RunnerDeps = deps
        self.batcher: PermitBatcher = batcher
        self.hypervisors: dict[str, FakeHypervisor] = {}
        self.tmp_path = tmp_path

    @property
    def metrics(self) -> AgentMetrics:
        return self.deps.metrics

    def vm(
        self,
        name,
        *,
        current=2,
        min_vcpus=1,
        max_vcpus=8,
        load=0.0,
        permitted=None,
        memory=GiB,
        max_memory=None,
    ):
        target = VmTarget(
            namespace="default",
            name=name,
            uid=f"uid-{name}",
            node=NODE,
            spec=VmSpec(
                min_vcpus=min_vcpus,
                max_vcpus=max_vcpus,
                min_memory_bytes=memory,
                max_memory_bytes=max_memory or memory,
            ),
            hypervisor_url=f"qmp:///run/{name}.sock",
            metrics_url=self.metrics_app.url(self.metrics_base, name),
            permitted_vcpus=permitted,
        )
        self.hypervisors[target.key] = FakeHypervisor(
            current=current, max_vcpus=max_vcpus, memory=memory, max_memory=max_memory
        )
        self.metrics_app.loads[name] = load
        return target

    def sample(self, name: str, *labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, dict(labels) if labels else None)


CORE = CoreConfig(
    scrape_interval_seconds=0.1,
    policy=PolicyConfig(shrink_after_seconds=0.5),
    permit_retry_seconds=0.3,
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    resize_failure_hold_seconds=0.5,
    memory=MemoryPolicyConfig(shrink_after_seconds=0.5, lookahead_seconds=0.2),
)


@pytest.fixture
async def world(tmp_path):
    extender = FakeExtender(node=NODE, capacity_vcpus=16, token=TOKEN)
    metrics_app = SyntheticMetrics()
    token_path = tmp_path / "token"
    token_path.write_text(TOKEN + "\n")
    async with (
        serving(extender.app()) as ext_url,
        serving(metrics_app.app()) as metrics_url,
        aiohttp.ClientSession() as session,
    ):
        client = ExtenderClient(
            session,
            base_url=ext_url,
            node=NODE,
            token=TokenFile(token_path),
            timeout_seconds=1.0,
        )
        batcher = PermitBatcher(client, window_seconds=BATCH_WINDOW_SECONDS)
        metrics = AgentMetrics(CollectorRegistry())
        holder: dict[str, World] = {}
        deps = RunnerDeps(
            core=CORE,
            node=NODE,
            session=session,
            permits=batcher,
            hypervisor_for=lambda t: holder["w"].hypervisors[t.key],
            metrics=metrics,
            scrape_timeout_seconds=0.5,
            rng=random.Random(7),
            epochs=client.epochs,
        )
        loops = VmLoops(deps)
        supervisor = Supervisor(
            loops.run,
            node=NODE,
            metrics=metrics,
            restart_delay_seconds=0.1,
            update_vm=loops.update,
        )
        w = World(
            extender=extender,
            metrics_app=metrics_app,
            metrics_base=metrics_url,
            supervisor=supervisor,
            deps=deps,
            batcher=batcher,
            tmp_path=tmp_path,
        )
        holder["w"] = w
        try:
            yield w
        finally:
            await supervisor.close()
            await batcher.close()
