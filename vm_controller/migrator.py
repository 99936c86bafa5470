"""The migration controller's loop: watch VirtualMachineMigrations, move VMs live.

Shell: I/O only. Every decision is pure: ``migrations`` (refuse or plan, the target pod, the
status, what a restart finds) and ``vm_runner.migration`` (the move itself: cut over only when
the source says completed and the target runs). This module asks the extender for the target's
room (``POST /v1/moves``, ``ExtenderMoves``), writes the objects, and drives both QEMUs.

*How the driver reaches QEMU, and the threat model.* Like Neon's neonvm-controller, the driver
speaks QMP over TCP to the runner pods' IPs (each runner's ``--migration-port``), and the
source sends the VM's state to the target's ``-incoming`` TCP port: no agent on the nodes is
involved, and the driver holds no host paths. An open QMP port is a full control channel to the
VM (read its memory, stop it, quit it) and the incoming port accepts a whole machine state from
whoever connects first, both unauthenticated and unencrypted: anyone who can reach the pod's IP
owns the VM. What restricts them is the NetworkPolicy of
``manifests/vm-controller/migration-networkpolicy.yaml`` (QMP only from the vm-controller's
pods, the incoming port only from the namespace's VM pods), which needs a CNI that enforces
NetworkPolicy; without one, the pod network must itself be trusted. The state crosses the
network in clear text (QEMU's TLS migration is not used).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Final

import aiohttp
import msgspec
import structlog

from kube_io import Changed, Conflict, KubeError, NotFound
from kube_io.watch import watch_objects
from protocol import annotations as ann
from protocol import codec
from protocol.kube import Pod
from protocol.moves import CancelMove, MoveAnswer, ReserveMove
from protocol.virtualmachine import (
    MIGRATION_KIND,
    VirtualMachineMigration,
    VirtualMachineMigrationStatus,
)
from vm_controller import decide, migrations
from vm_controller.controller import Backoff, Controller, Key
from vm_controller.metrics import ControllerMetrics
from vm_runner.migrate import migrate
from vm_runner.migration import MigrationConfig, Outcome

log = structlog.get_logger("vm_controller.migrator")

# The target pod gets this long to be Running with an IP before the move is given up.
DEFAULT_TARGET_POD_TIMEOUT_SECONDS: Final = 120.0
_POLL_SECONDS: Final = 0.5


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MoveRefusedByExtender(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ExtenderMoves:
    """The extender's ``POST /v1/moves``. The token is read from ``token_file`` at each call (a
    projected ServiceAccount token for the extender's audience, which the kubelet rotates)."""

    def __init__(self, url: str, token_file: str) -> None:
        self.url = url.rstrip("/") + "/v1/moves"
        self.token_file = Path(token_file)
        self.session: aiohttp.ClientSession | None = None

    async def _post(self, body: ReserveMove | CancelMove) -> MoveAnswer:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        token = self.token_file.read_text().strip()
        async with self.session.post(
            self.url,
            data=codec.encode(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        ) as response:
            data = await response.read()
            if response.status == 200:
                return codec.decode(MoveAnswer, data)
            if 400 <= response.status < 500 and response.status not in (401, 429):
                error = msgspec.json.decode(data) if data else {}
                reason = (
                    error.get("reason", str(response.status)) if isinstance(error, dict) else ""
                )
                message = error.get("message", "") if isinstance(error, dict) else data.decode()
                raise MoveRefusedByExtender(str(reason), str(message))
            raise OSError(f"extender answered {response.status}: {data[:200]!r}")

    async def reserve(self, plan: migrations.Plan) -> MoveAnswer:
        return await self._post(
            ReserveMove(
                source_uid=plan.source_uid, target_pod=plan.target_pod, target_node=plan.target_node
            )
        )

    async def cancel(self, source_uid: str) -> None:
        await self._post(CancelMove(source_uid=source_uid))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class Migrator:
    def __init__(
        self,
        controller: Controller,
        extender: ExtenderMoves,
        metrics: ControllerMetrics,
        config: MigrationConfig,
        *,
        clock: Callable[[], float] | None = None,
        target_pod_timeout_seconds: float = DEFAULT_TARGET_POD_TIMEOUT_SECONDS,
    ) -> None:
        self.controller = controller
        self.target_pod_timeout_seconds = target_pod_timeout_seconds
        self.client = controller.client
        self.extender = extender
        self.metrics = metrics
        self.config = config
        self.clock = clock
        self.vmms: dict[Key, VirtualMachineMigration] = {}
        self.driving: dict[Key, asyncio.Task[None]] = {}
        # Migrations (by uid) this process ended: the watch may still bring their older
        # ``Running`` status, which must not be taken for a move a restart interrupted.
        self.ended: set[str] = set()
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        # A transient failure (the extender unreachable, an API error a retry can fix): the
        # migration comes back after a delay that doubles while it keeps failing.
        self.retries = Backoff()
        self.listed = asyncio.Event()
        controller.pod_listeners.append(self._vm_pods_changed)

    def enqueue(self, key: Key) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def _vm_pods_changed(self, vm_key: Key) -> None:
        for key, vmm in self.vmms.items():
            if key[0] == vm_key[0] and vmm.spec.vm_name == vm_key[1] and migrations.is_active(vmm):
                self.enqueue(key)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.watch())
            tasks.create_task(self.work())

    async def watch(self) -> None:
        async for item in watch_objects(self.client, "virtualmachinemigrations"):
            if isinstance(item, Changed):
                key = (item.object.metadata.namespace, item.object.metadata.name)
                if item.type == "DELETED":
                    self.vmms.pop(key, None)
                else:
                    self.vmms[key] = item.object
                self.enqueue(key)
                continue
            self.vmms = {(v.metadata.namespace, v.metadata.name): v for v in item.objects}
            for key in self.vmms:
                self.enqueue(key)
            self.listed.set()

    async def work(self) -> None:
        await self.listed.wait()
        await self.controller.vms_listed.wait()
        await self.controller.pods_listed.wait()
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            vmm = self.vmms.get(key)
            if (
                vmm is None
                or not migrations.is_active(vmm)
                or key in self.driving
                or vmm.metadata.uid in self.ended
            ):
                continue
            with structlog.contextvars.bound_contextvars(namespace=key[0], migration=key[1]):
                try:
                    await self.handle(key, vmm)
                except (KubeError, OSError, aiohttp.ClientError, TimeoutError) as e:
                    self._retry(key, "migration_retrying", e)
                else:
                    if key not in self.driving:
                        self.retries.forget(key)

    def _retry(self, key: Key, event: str, error: Exception) -> None:
        delay = self.retries.next_delay(key)
        log.warning(event, error=repr(error), delay_seconds=delay)
        asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    # -- one migration ----------------------------------------------------------------------

    def _pods(self, vmm: VirtualMachineMigration) -> dict[str, Pod]:
        return self.controller.pods.get((vmm.metadata.namespace, vmm.spec.vm_name), {})

    async def handle(self, key: Key, vmm: VirtualMachineMigration) -> None:
        if vmm.status.phase == "Running":
            pods = self._pods(vmm)
            source = pods.get(vmm.status.source_pod or "")
            target = pods.get(vmm.status.target_pod or "")
            if migrations.recover(source, target) == "finish":
                assert target is not None
                await self._cut_over(vmm, source, target)
                await self._finish(
                    key,
                    vmm,
                    vmm.status,
                    succeeded=True,
                    reason="Completed",
                    message="the move had cut over before a controller restart",
                )
            else:
                await self._abort(vmm, vmm.status, source, target)
                await self._finish(
                    key,
                    vmm,
                    vmm.status,
                    succeeded=False,
                    reason="Interrupted",
                    message="the controller restarted during the move; the source runs on",
                )
            return
        vm = self.controller.vms.get((vmm.metadata.namespace, vmm.spec.vm_name))
        source = decide.current_pod(vm, self._pods(vmm)) if vm is not None else None
        others = [v for k, v in self.vmms.items() if k[0] == key[0]]
        decided = migrations.admit(vmm, vm, source, others)
        if isinstance(decided, migrations.Refused):
            await self._refuse(key, vmm, decided)
            return
        assert vm is not None and source is not None
        plan = decided
        try:
            answer = await self.extender.reserve(plan)
        except MoveRefusedByExtender as e:
            await self._refuse(key, vmm, migrations.Refused(reason=e.reason, message=e.message))
            return
        plan = migrations.placed(plan, answer.target_node)
        if plan.target_node is None:
            await self.extender.cancel(plan.source_uid)
            why = migrations.Refused(
                reason=migrations.Refusal.NO_TARGET_NODE,
                message="the extender reserved room without naming the node",
            )
            await self._refuse(key, vmm, why)
            return
        status = migrations.started(plan, now=_now())
        try:
            await self.client.patch_virtual_machine_migration_status(*key, status)
            await self.client.patch_pod_annotations(
                key[0], plan.source_pod, migrations.source_marks(vmm, plan)
            )
            await self.client.create_namespaced(
                "pods", migrations.target_pod(vm, source, plan, vmm.metadata.name)
            )
        except BaseException:
            # Nothing half-done: whatever was written is undone by the abort path.
            with contextlib.suppress(KubeError, OSError, aiohttp.ClientError):
                await self._abort(vmm, status, source, None)
            raise
        self.metrics.migrations_started.inc()
        await self._event(
            vmm,
            "Normal",
            "Started",
            f"moving {plan.source_pod} on {plan.source_node}"
            f" to {plan.target_pod} on {plan.target_node}",
        )
        self.driving[key] = asyncio.create_task(
            self._drive(key, vmm, status, source_uid=plan.source_uid)
        )

    async def _refuse(
        self, key: Key, vmm: VirtualMachineMigration, why: migrations.Refused
    ) -> None:
        with contextlib.suppress(NotFound):
            await self.client.patch_virtual_machine_migration_status(
                *key, migrations.refused(vmm, why, now=_now())
            )
        self.ended.add(vmm.metadata.uid)
        self.metrics.migrations_failed.labels(reason=why.reason).inc()
        log.info("migration_refused", reason=why.reason, message=why.message)
        await self._event(vmm, "Warning", why.reason, why.message)

    async def _target_ready(self, vmm: VirtualMachineMigration, name: str) -> Pod | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.target_pod_timeout_seconds
        while loop.time() < deadline:
            pod = self._pods(vmm).get(name)
            if pod is not None and pod.status.phase == "Running" and pod.status.pod_ip:
                return pod
            if pod is not None and pod.status.phase in ("Failed", "Succeeded"):
                return None
            await asyncio.sleep(_POLL_SECONDS)
        return None

    async def _drive(
        self,
        key: Key,
        vmm: VirtualMachineMigration,
        status: VirtualMachineMigrationStatus,
        *,
        source_uid: str,
    ) -> None:
        began = asyncio.get_running_loop().time()
        try:
            assert status.source_pod and status.target_pod
            target: Pod | None = None
            source = self._pods(vmm).get(status.source_pod)
            # The source checked first: a move that cannot start fails at once, not after the
            # target's timeout.
            cannot = migrations.cannot_start(source, target, waited=False)
            if cannot is None:
                target = await self._target_ready(vmm, status.target_pod)
                source = self._pods(vmm).get(status.source_pod)
                cannot = migrations.cannot_start(source, target, waited=True)
            outcome: Outcome | None = None
            if cannot is None:
                assert source is not None and target is not None
                src_qmp, tgt_qmp = migrations.qmp_address(source), migrations.qmp_address(target)
                uri = migrations.incoming_uri(target)
                assert src_qmp and tgt_qmp and uri

                async def cut_over() -> None:
                    fresh = self._pods(vmm).get(status.target_pod or "", target)
                    await self._cut_over(vmm, source, fresh)

                outcome = await migrate(
                    source_qmp=src_qmp,
                    target_qmp=tgt_qmp,
                    target_uri=uri,
                    config=self.config,
                    clock=self.clock,
                    cut_over=cut_over,
                )
            if outcome is not None and outcome.succeeded:
                total = asyncio.get_running_loop().time() - began
                self.metrics.migration_seconds.observe(total)
                if outcome.downtime_ms is not None:
                    self.metrics.migration_downtime_seconds.observe(outcome.downtime_ms / 1000)
                await self._finish(
                    key,
                    vmm,
                    status,
                    succeeded=True,
                    reason="Completed",
                    message=f"moved to {status.target_pod} on {status.target_node}"
                    f" (downtime {outcome.downtime_ms} ms)",
                    downtime_ms=outcome.downtime_ms,
                    total_ms=outcome.qemu_total_time_ms,
                )
                return
            reason = _camel(outcome.reason.value) if outcome is not None else str(cannot)
            await self._abort(vmm, status, self._pods(vmm).get(status.source_pod), target)
            await self._finish(
                key,
                vmm,
                status,
                succeeded=False,
                reason=reason,
                message="the move failed; the source runs on, the target is removed",
                downtime_ms=outcome.downtime_ms if outcome else None,
            )
        except (KubeError, OSError, aiohttp.ClientError) as e:
            # The next pass of this migration (Running, no driver) recovers from the objects.
            self._retry(key, "migration_driver_failed", e)
        finally:
            self.driving.pop(key, None)

    async def _cut_over(
        self, vmm: VirtualMachineMigration, source: Pod | None, target: Pod
    ) -> None:
        """The target runs the VM: it becomes the VM's pod and serves its clients (target label
        off, serving label on, in one patch; the annotation off), the source serves no more
        (``decide.SERVING_LABEL``), then the source pod is deleted (restartPolicy Always: a
        source left to exit would be started again)."""
        ns = vmm.metadata.namespace
        await self.client.patch_pod_labels(
            ns,
            target.metadata.name,
            {migrations.TARGET_LABEL: None, decide.SERVING_LABEL: "true"},
        )
        await self.client.patch_pod_annotations(ns, target.metadata.name, {ann.MIGRATION: None})
        if source is not None:
            with contextlib.suppress(NotFound):
                await self.client.patch_pod_labels(
                    ns, source.metadata.name, {decide.SERVING_LABEL: None}
                )
            with contextlib.suppress(NotFound, Conflict):
                await self.client.delete_pod(ns, source.metadata.name, uid=source.metadata.uid)

    async def _abort(
        self,
        vmm: VirtualMachineMigration,
        status: VirtualMachineMigrationStatus,
        source: Pod | None,
        target: Pod | None,
    ) -> None:
        """The source runs on: the target pod deleted, the source's marks removed, then the
        reservation cancelled (in that order: an extender restarting in between rebuilds the
        reservation from the marks, ``Extender.pods_listed``, and the cancel then releases it).
        (QEMU's own abort, ``migrate_cancel`` and ``cont``, is the driver's.)"""
        ns = vmm.metadata.namespace
        target = target or self._pods(vmm).get(status.target_pod or "")
        if target is not None:
            with contextlib.suppress(NotFound, Conflict):
                await self.client.delete_pod(ns, target.metadata.name, uid=target.metadata.uid)
        if source is not None:
            with contextlib.suppress(NotFound):
                unmarked = dict.fromkeys(migrations.source_marks(vmm, None))
                await self.client.patch_pod_annotations(ns, source.metadata.name, unmarked)
            await self.extender.cancel(source.metadata.uid)

    async def _finish(
        self,
        key: Key,
        vmm: VirtualMachineMigration,
        status: VirtualMachineMigrationStatus,
        *,
        succeeded: bool,
        reason: str,
        message: str,
        downtime_ms: int | None = None,
        total_ms: int | None = None,
    ) -> None:
        self.retries.forget(key)
        final = migrations.finished(
            status,
            succeeded=succeeded,
            reason=reason,
            message=message,
            now=_now(),
            downtime_ms=downtime_ms,
            total_ms=total_ms,
        )
        with contextlib.suppress(NotFound):
            await self.client.patch_virtual_machine_migration_status(*key, final)
        self.ended.add(vmm.metadata.uid)
        if succeeded:
            self.metrics.migrations_succeeded.inc()
        else:
            self.metrics.migrations_failed.labels(reason=reason).inc()
        log.info("migration_finished", succeeded=succeeded, reason=reason, downtime_ms=downtime_ms)
        await self._event(vmm, "Normal" if succeeded else "Warning", reason, message)

    async def _event(
        self, vmm: VirtualMachineMigration, type_: str, reason: str, message: str
    ) -> None:
        await self.controller.object_event(MIGRATION_KIND, vmm.metadata, type_, reason, message)
        vm = self.controller.vms.get((vmm.metadata.namespace, vmm.spec.vm_name))
        if vm is not None:
            await self.controller.event(
                vm, type_, f"Migration{reason}", f"{vmm.metadata.name}: {message}"
            )


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))
