"""The Lease loop: the I/O around ``core.leadership.Elector``.

Shell, no policy. It reads and writes the extender's Lease when the elector says so, reads
kube-scheduler's Lease to learn whether this pod's kube-scheduler leads (the elector's
candidacy), and tells the ``Extender`` when this replica gains or loses the right to decide.
The decisions themselves ask ``Extender.require_synced`` -> ``elector.is_leading(now)`` each
time, so a hold that lapses while this loop waits on the API server stops them at once.

A gain is handled before anything else can run: between the accepted write and
``Extender.leadership_gained`` (``Ledger.forget_agents``, a new epoch) there is no ``await``.

The leader also labels the pods (``leader_label``), and the permit Service selects
"leader", so agents reach the leader while both pods stay Ready (a warm standby must count as
available, or no PodDisruptionBudget could let the leader's node drain). Only the leader
writes them, through the same gate as every other write (``kube/link.py``): on taking the
Lease it labels its own pod "leader" and every other pod of its namespace still labelled
"leader" "standby" (pods start as "standby", from the Deployment's template). A deposed
leader does not take its own label off: it writes nothing once it has lost the Lease, and a
partitioned one could not anyway; the new leader relabels it as soon as it leads. The label is
routing only: one that lags sends an agent to a replica that refuses with 503 and Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import Callable, Mapping
from typing import Final, Protocol

import structlog

from kube_io.errors import Conflict, KubeError, NotFound
from kube_io.objects import Lease, LeaseMeta, LeaseSpec
from protocol.kube import Pod
from scheduler_extender.config import LeaderElectionConfig
from scheduler_extender.core.leadership import Elector, LeaseRecord, Write

log = structlog.get_logger(__name__)

_API_VERSION: Final = "coordination.k8s.io/v1"


class LeaseApi(Protocol):
    """The ``KubeClient`` calls this loop makes."""

    async def get_lease(self, namespace: str, name: str) -> Lease: ...

    async def create_lease(self, lease: Lease) -> Lease: ...

    async def replace_lease(self, lease: Lease) -> Lease: ...


class PodLabels(Protocol):
    """The gated ``KubeLink`` calls of the role labels."""

    async def list_pods(
        self, *, field_selector: str, label_selector: str | None = None
    ) -> list[Pod]: ...

    async def patch_pod_labels(
        self, namespace: str, name: str, labels: Mapping[str, str | None]
    ) -> None: ...


class Follower(Protocol):
    """What the loop tells (the ``Extender``)."""

    def leadership_gained(self, elector: Elector) -> None: ...

    def leadership_lost(self, elector: Elector) -> None: ...


def identity_of(host: str, pod: tuple[str, str] | None) -> str:
    """Who holds the extender's Lease: the pod's name, or outside a pod the host and a
    uniquifier (kube-scheduler's form, so that two processes on one host never share one).

    In a pod the name alone: the kubelet runs one extender container per pod at a time, so a
    leader whose container crashed and was restarted in place finds its own name on the Lease
    and takes it back at once, as a single replica's restart would, instead of waiting out its
    own Lease. It starts from the restart path like any new process (every VM unverified, a new
    epoch), and the process before it, being dead, decides nothing more.
    """
    if pod is not None:
        return pod[1]
    return f"{host}_{uuid.uuid4().hex}"


def record_of(lease: Lease) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity or "",
        duration_seconds=spec.lease_duration_seconds or 0,
        transitions=spec.lease_transitions or 0,
        version=lease.metadata.resource_version or "",
    )


def lease_of(write: Write, *, namespace: str, name: str, wall: float, acquired: bool) -> Lease:
    """The Lease to send for ``write``; the times are MicroTime, for humans (``kubectl``)."""
    stamp = datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    record = write.record
    return Lease(
        api_version=_API_VERSION,
        kind="Lease",
        metadata=LeaseMeta(name=name, namespace=namespace, resource_version=write.version or None),
        spec=LeaseSpec(
            holder_identity=record.holder or None,
            lease_duration_seconds=int(record.duration_seconds),
            acquire_time=stamp if acquired else None,
            renew_time=stamp,
            lease_transitions=record.transitions,
        ),
    )


class LeaderLoop:
    def __init__(
        self,
        config: LeaderElectionConfig,
        api: LeaseApi,
        follower: Follower,
        *,
        labels: PodLabels | None = None,
        host: str,
        pod: tuple[str, str] | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.api = api
        self.follower = follower
        self.labels = labels
        self.host = host
        self.pod = pod
        self.clock = clock
        self.wall_clock = wall_clock
        self.elector = Elector(
            identity_of(host, pod),
            duration_seconds=config.lease_duration_seconds,
            renew_seconds=config.renew_seconds,
            retry_seconds=config.retry_seconds,
            drift=config.clock_drift_fraction,
        )
        self.elector.candidacy_changed(clock(), is_candidate=config.scheduler_lease_name is None)
        self._was_leading = False
        self._scheduler_read_at: float | None = None
        self._role = asyncio.Event()
        self._timeout = max(config.renew_seconds, config.retry_seconds)

    async def run(self) -> None:
        log.info("leader_election_started", identity=self.elector.identity)
        labels = asyncio.create_task(self._label_loop()) if self._labels_pod else None
        try:
            while True:
                await self._follow_scheduler()
                step = self.elector.step(self.clock())
                if step.read:
                    await self._read()
                elif step.write is not None:
                    await self._write(step.write)
                else:
                    self._notice()
                    wait = step.wait_seconds
                    if self._scheduler_read_at is not None:
                        due = self._scheduler_read_at + self.config.retry_seconds
                        wait = min(wait, max(0.0, due - self.clock()))
                    await asyncio.sleep(wait)
                self._notice()
        finally:
            if labels is not None:
                labels.cancel()
                await asyncio.gather(labels, return_exceptions=True)

    async def resign(self) -> None:
        """Graceful shutdown: stop deciding, then hand the Lease over at once (released)."""
        now = self.clock()
        if not self.elector.is_leading(now):
            return
        self.elector.candidacy_changed(now, is_candidate=False)
        self._notice()
        step = self.elector.step(now)
        if step.write is not None:
            try:
                async with asyncio.timeout(self._timeout):
                    await self._write(step.write)
            except (KubeError, TimeoutError) as e:
                log.warning("lease_release_failed", error=str(e))

    # -- the extender's Lease -------------------------------------------------------------

    async def _read(self) -> None:
        config = self.config
        try:
            async with asyncio.timeout(self._timeout):
                lease = await self.api.get_lease(config.lease_namespace, config.lease_name)
        except NotFound:
            self.elector.read(self.clock(), None)
        except (KubeError, TimeoutError) as e:
            log.warning("lease_read_failed", error=str(e))
            self.elector.failed(self.clock())
        else:
            self.elector.read(self.clock(), record_of(lease))

    async def _write(self, write: Write) -> None:
        config = self.config
        sent_at = self.clock()
        previous = self.elector.observed
        acquired = write.record.holder != "" and (
            previous is None or previous.holder != write.record.holder
        )
        lease = lease_of(
            write,
            namespace=config.lease_namespace,
            name=config.lease_name,
            wall=self.wall_clock(),
            acquired=acquired,
        )
        try:
            async with asyncio.timeout(self._timeout):
                if write.version:
                    answer = await self.api.replace_lease(lease)
                else:
                    answer = await self.api.create_lease(lease)
        except Conflict:
            log.info("lease_write_conflicted", holder=write.record.holder)
            self.elector.write_conflicted(self.clock())
        except (KubeError, TimeoutError) as e:
            log.warning("lease_write_failed", error=str(e))
            self.elector.failed(self.clock())
        else:
            self.elector.wrote(sent_at, record_of(answer))
            self._notice()  # no await since the write was accepted: gain before any decision

    def _notice(self) -> None:
        leading = self.elector.is_leading(self.clock())
        if leading == self._was_leading:
            return
        self._was_leading = leading
        if leading:
            self.follower.leadership_gained(self.elector)
        else:
            self.follower.leadership_lost(self.elector)
        self._role.set()

    # -- kube-scheduler's Lease -----------------------------------------------------------

    async def _follow_scheduler(self) -> None:
        config = self.config
        name = config.scheduler_lease_name
        now = self.clock()
        if name is None or (
            self._scheduler_read_at is not None
            and now < self._scheduler_read_at + config.retry_seconds
        ):
            return
        self._scheduler_read_at = now
        try:
            async with asyncio.timeout(self._timeout):
                lease = await self.api.get_lease(config.lease_namespace, name)
        except NotFound:
            holder = ""
        except (KubeError, TimeoutError) as e:
            log.warning("scheduler_lease_read_failed", error=str(e))
            return
        else:
            holder = lease.spec.holder_identity or ""
        is_candidate = holder.startswith(f"{self.host}_")
        if is_candidate != self.elector.is_candidate:
            log.info("candidacy_changed", is_candidate=is_candidate, scheduler_holder=holder)
            # Resigning stops our decisions here; the loop's next step releases the Lease.
            self.elector.candidacy_changed(self.clock(), is_candidate=is_candidate)
            self._notice()

    # -- the routing label ----------------------------------------------------------------

    @property
    def _labels_pod(self) -> bool:
        return (
            self.labels is not None
            and self.pod is not None
            and self.config.leader_label is not None
        )

    async def _label_loop(self) -> None:
        """Each term this replica leads: its own pod "leader", any other "standby"."""
        labels = self.labels
        assert labels is not None
        assert self.pod is not None and self.config.leader_label is not None
        namespace, name = self.pod
        label = self.config.leader_label
        labelled: int | None = None
        while True:
            await self._role.wait()
            self._role.clear()
            term = self.elector.term
            if not self._was_leading or term == labelled:
                continue
            try:
                async with asyncio.timeout(self._timeout):
                    await labels.patch_pod_labels(namespace, name, {label: "leader"})
                    others = await labels.list_pods(
                        field_selector=f"metadata.namespace={namespace}",
                        label_selector=f"{label}=leader",
                    )
                    others = [p for p in others if p.metadata.name != name]
                    for pod in others:
                        with contextlib.suppress(NotFound):  # its pod is gone already
                            await labels.patch_pod_labels(
                                namespace, pod.metadata.name, {label: "standby"}
                            )
            except (KubeError, TimeoutError) as e:
                log.warning("role_label_failed", term=term, error=str(e))
                await asyncio.sleep(self.config.retry_seconds)
                self._role.set()
                continue
            labelled = term
            log.info("role_labelled", term=term, standby=[p.metadata.name for p in others])
