"""The controller's loop: watch VirtualMachines, their pods and their Services, reconcile one VM
at a time.

Shell: I/O only. The decision for a VM is ``decide.reconcile``; this module keeps the watched
objects, queues the VMs whose objects changed, applies the actions, and retries a VM whose
request failed for a reason a retry can fix. The shape is controller-runtime's: level-triggered
(each pass decides from the whole current state of one VM, never from the event that woke it),
one queue that holds a key at most once, so a burst of changes to one VM is one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable
from typing import Final

import msgspec
import structlog

from kube_io import Changed, Conflict, KubeClient, KubeError, NotFound, ObjectReference
from kube_io.watch import watch_objects
from protocol.kube import ObjectMeta, Pod, Service
from protocol.virtualmachine import API_VERSION, KIND, VirtualMachine
from vm_controller import decide
from vm_controller.metrics import ControllerMetrics

log = structlog.get_logger("vm_controller")

COMPONENT: Final = "vm-controller"
Key = tuple[str, str]  # (namespace, VM name) -- also the pod's and the Service's name

# A failed pass that a retry can fix comes back after this long, doubling up to the cap.
RETRY_FIRST_SECONDS: Final = 0.5
RETRY_MAX_SECONDS: Final = 30.0


class Backoff:
    """Per-key retry delays for failures a retry can fix: ``first`` seconds, doubling at each
    failure up to ``cap``, back to ``first`` once the key succeeds (``forget``). The VM loop and
    the migrations' share it (controller-runtime's per-item exponential rate limiter)."""

    def __init__(self, first: float = RETRY_FIRST_SECONDS, cap: float = RETRY_MAX_SECONDS) -> None:
        self.first = first
        self.cap = cap
        self.delays: dict[Key, float] = {}

    def next_delay(self, key: Key) -> float:
        delay = min(self.delays.get(key, self.first / 2) * 2, self.cap)
        self.delays[key] = delay
        return delay

    def forget(self, key: Key) -> None:
        self.delays.pop(key, None)


def _key_of(vm: VirtualMachine) -> Key:
    return vm.metadata.namespace, vm.metadata.name


def _pod_key(pod: Pod) -> Key | None:
    name = (pod.metadata.labels or {}).get(decide.VM_NAME_LABEL)
    return (pod.metadata.namespace, name) if name else None


def _service_key(service: Service) -> Key:
    return service.metadata.namespace, service.metadata.name


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    def __init__(self, client: KubeClient, metrics: ControllerMetrics) -> None:
        self.client = client
        self.metrics = metrics
        self.vms: dict[Key, VirtualMachine] = {}
        # Every pod labelled with a VM's name, by pod name: its own, and a live move's target.
        self.pods: dict[Key, dict[str, Pod]] = {}
        # The Services this controller makes (they carry the VM-name label), by their name: one
        # deleted by hand is made again at once. One of a VM's name without the label (not
        # ours) is read on demand, in ``apply``.
        self.services: dict[Key, Service] = {}
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.retries = Backoff()
        self.rechecks: dict[Key, asyncio.TimerHandle] = {}
        self.pod_listeners: list[Callable[[Key], None]] = []
        self.vms_listed = asyncio.Event()
        self.pods_listed = asyncio.Event()
        self.services_listed = asyncio.Event()

    @property
    def is_synced(self) -> bool:
        return all(e.is_set() for e in (self.vms_listed, self.pods_listed, self.services_listed))

    def enqueue(self, key: Key) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.watch_vms())
            tasks.create_task(self.watch_pods())
            tasks.create_task(self.watch_services())
            tasks.create_task(self.work())

    async def watch_vms(self) -> None:
        async for item in watch_objects(self.client, "virtualmachines"):
            if isinstance(item, Changed):
                key = _key_of(item.object)
                if item.type == "DELETED":
                    self.vms.pop(key, None)
                else:
                    self.vms[key] = item.object
                self.enqueue(key)
                continue
            gone = set(self.vms)
            self.vms = {_key_of(vm): vm for vm in item.objects}
            for key in gone | set(self.vms):
                self.enqueue(key)
            self.metrics.virtual_machines.set(len(self.vms))
            self.vms_listed.set()
        # watch_objects never ends on its own

    async def watch_pods(self) -> None:
        async for item in watch_objects(self.client, "pods", label_selector=decide.VM_NAME_LABEL):
            if isinstance(item, Changed):
                key = _pod_key(item.object)
                if key is None:
                    continue
                name = item.object.metadata.name
                if item.type == "DELETED":
                    self.pods.get(key, {}).pop(name, None)
                    if not self.pods.get(key):
                        self.pods.pop(key, None)
                else:
                    self.pods.setdefault(key, {})[name] = item.object
                self.enqueue(key)
                self.pod_changed(key)
                continue
            before = set(self.pods)
            self.pods = {}
            for pod in item.objects:
                if (k := _pod_key(pod)) is not None:
                    self.pods.setdefault(k, {})[pod.metadata.name] = pod
            for key in before | set(self.pods):
                self.enqueue(key)
                self.pod_changed(key)
            self.pods_listed.set()

    async def watch_services(self) -> None:
        label = decide.VM_NAME_LABEL
        async for item in watch_objects(self.client, "services", label_selector=label):
            if isinstance(item, Changed):
                key = _service_key(item.object)
                if item.type == "DELETED":
                    self.services.pop(key, None)
                else:
                    self.services[key] = item.object
                self.enqueue(key)
                continue
            before = set(self.services)
            self.services = {_service_key(s): s for s in item.objects}
            for key in before | set(self.services):
                self.enqueue(key)
            self.services_listed.set()

    async def work(self) -> None:
        await self.vms_listed.wait()
        await self.pods_listed.wait()
        await self.services_listed.wait()
        log.info("vm_controller_synced", vms=len(self.vms), pods=len(self.pods))
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            await self.reconcile(key)

    async def reconcile(self, key: Key) -> None:
        vm = self.vms.get(key)
        if vm is None:
            handle = self.rechecks.pop(key, None)
            if handle is not None:
                handle.cancel()
            return
        with structlog.contextvars.bound_contextvars(namespace=key[0], vm=key[1]):
            try:
                with self.metrics.reconcile_seconds.time():
                    await self.apply(vm)
            except KubeError as e:
                self.metrics.reconciles.labels(result="error").inc()
                if not e.is_retryable and not isinstance(e, Conflict):
                    # RBAC, a refused object: a retry cannot help; the next change will.
                    log.error("vm_reconcile_failed", error=repr(e))
                    await self.event(vm, "Warning", "ReconcileFailed", e.message)
                    return
                delay = self.retries.next_delay(key)
                log.warning("vm_reconcile_retrying", error=repr(e), delay_seconds=delay)
                asyncio.get_running_loop().call_later(delay, self.enqueue, key)
            else:
                self.retries.forget(key)
                self.metrics.reconciles.labels(result="ok").inc()

    def pod_changed(self, key: Key) -> None:
        """A pod of VM ``key`` changed: whoever else acts on a VM's pods hears of it (the
        migrations of ``vm_controller.migrator``)."""
        for listener in self.pod_listeners:
            listener(key)

    async def apply(self, vm: VirtualMachine) -> None:
        key = _key_of(vm)
        pod = decide.current_pod(vm, self.pods.get(key, {}))
        service = self.services.get(key)
        if service is None:
            # Not one of ours as far as the watch knows: one we made that the watch has not
            # shown yet, another's, or none.
            try:
                service = await self.client.get_service(*key)
            except NotFound:
                service = None
        actions = decide.reconcile(vm, pod, service=service, now=_now())
        if actions.create_service is not None:
            try:
                await self.client.create_namespaced("services", actions.create_service)
            except Conflict:
                self.enqueue(key)  # made since it was read: whose it is decides the next pass
            else:
                await self.event(vm, "Normal", "ServiceCreated", f"created service {key[1]}")
        if actions.delete_pod_uid is not None and pod is not None:
            with contextlib.suppress(NotFound, Conflict):  # gone already, or a newer pod
                await self.client.delete_pod(key[0], pod.metadata.name, uid=actions.delete_pod_uid)
        if actions.patch_pod_annotations is not None and pod is not None:
            with contextlib.suppress(NotFound):  # gone meanwhile: its successor is made right
                await self.client.patch_pod_annotations(
                    key[0], pod.metadata.name, actions.patch_pod_annotations
                )
            log.info("vm_pod_annotated", pod=pod.metadata.name,
                     annotations=actions.patch_pod_annotations)  # fmt: skip
        if actions.patch_pod_labels is not None and pod is not None:
            with contextlib.suppress(NotFound):
                await self.client.patch_pod_labels(
                    key[0], pod.metadata.name, actions.patch_pod_labels
                )
            log.info("vm_pod_labelled", pod=pod.metadata.name, labels=actions.patch_pod_labels)
        if actions.patch_service_selector is not None:
            with contextlib.suppress(NotFound):  # deleted meanwhile: made again next pass
                await self.client.patch_service_selector(*key, actions.patch_service_selector)
            log.info("vm_service_selector_set", selector=actions.patch_service_selector)
        if actions.create_pod is not None:
            try:
                await self.client.create_namespaced("pods", actions.create_pod)
            except Conflict:
                # The name is still taken (a pod we have not heard of yet, or one terminating):
                # its watch event brings us back here.
                log.debug("vm_pod_name_taken")
            else:
                self.metrics.pods_created.inc()
                log.info("vm_pod_created", pod=key[1])
                await self.event(vm, "Normal", "PodCreated", f"created runner pod {key[1]}")
        for event in actions.events:
            await self.event(vm, event.type, event.reason, event.message)
        if actions.recheck_seconds is not None and key not in self.rechecks:
            self.rechecks[key] = asyncio.get_running_loop().call_later(
                actions.recheck_seconds, self.recheck, key
            )
        if actions.status != vm.status:
            try:
                await self.client.patch_virtual_machine_status(*key, actions.status)
            except NotFound:
                return  # deleted meanwhile: nothing to report on
            if self.vms.get(key) is vm:
                # The status just written, until the watch brings it: a pass in between (a pod
                # event) decides from it, and does not send a transition's Event twice.
                self.vms[key] = msgspec.structs.replace(vm, status=actions.status)
            if actions.status.phase != vm.status.phase:
                log.info("vm_phase", phase=actions.status.phase, node=actions.status.node)

    def recheck(self, key: Key) -> None:
        self.rechecks.pop(key, None)
        self.enqueue(key)

    async def event(self, vm: VirtualMachine, type_: str, reason: str, message: str) -> None:
        await self.object_event(KIND, vm.metadata, type_, reason, message)

    async def object_event(
        self, kind: str, meta: ObjectMeta, type_: str, reason: str, message: str
    ) -> None:
        """An Event about one of this controller's objects (``kind`` of ``API_VERSION``)."""
        involved = ObjectReference(
            api_version=API_VERSION,
            kind=kind,
            name=meta.name,
            namespace=meta.namespace,
            uid=meta.uid or None,
        )
        try:
            await self.client.create_event(
                involved,
                reason=reason,
                message=message,
                type="Warning" if type_ == "Warning" else "Normal",
                component=COMPONENT,
            )
        except KubeError as e:
            # An Event is a courtesy to the reader of `kubectl describe`, never a reason to fail.
            log.warning("vm_event_failed", reason=reason, error=repr(e))
