"""``KubeLink``: the extender's handle on a ``KubeClient`` that is connected later.

Shell. The app is built before the event loop runs (aiohttp's factories), but a ``KubeClient``
can only be made inside the loop; the app's ``cleanup_ctx`` connects it. Until then (and after
close) every call raises ``kube_io.errors.Unavailable``, which callers already treat as
"retry later". Each method is the ``KubeClient`` method of the same name.

It is also the one gate of the extender's writes. Every write to the API server but the Lease's
own (a Binding, the fence, wake-up touches, Events, the durability writer's patches and
resizes, the role labels, relief's VirtualMachineMigrations, a drain's taints and evictions)
goes through this link, which asks ``may_write`` right before sending, with no ``await`` in
between; a replica that does not lead gets ``Deposed`` and sends nothing. ``may_write`` is
``Extender.may_write``: the Lease's term this replica began writing in, and whether it still
holds it (``core.leadership.Elector.may_write``). Reads and token reviews are not writes and
are not gated (the standby keeps its ledger warm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from kube_io.client import KubeClient
from kube_io.errors import KubeError, Unavailable
from kube_io.objects import ObjectReference, SubjectAccessReviewStatus, TokenReviewResult
from protocol.kube import Node, Pod, Taint
from protocol.virtualmachine import VirtualMachineMigration


class Deposed(KubeError):
    """A write refused before it was sent: this replica does not hold the extender's Lease
    (or holds it in a later term than the write's). Not retryable: the leader writes."""


def _always() -> bool:
    return True


class KubeLink:
    def __init__(self) -> None:
        self.client: KubeClient | None = None
        # The gate (module docstring); the only replica (no leader election) always writes.
        self.may_write: Callable[[], bool] = _always

    def _client(self) -> KubeClient:
        if self.client is None:
            raise Unavailable("not connected to the Kubernetes API")
        return self.client

    def _writer(self) -> KubeClient:
        """The client, for one write to be sent at once: only if this replica may write."""
        client = self._client()
        if not self.may_write():
            raise Deposed("this replica does not lead: it writes nothing to the API server")
        return client

    async def get_pod(self, namespace: str, name: str) -> Pod:
        return await self._client().get_pod(namespace, name)

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, resource_version: str | None
    ) -> None:
        await self._writer().bind_pod(
            namespace, name, uid=uid, node=node, resource_version=resource_version
        )

    async def list_pods(
        self, *, field_selector: str, label_selector: str | None = None
    ) -> list[Pod]:
        pods, _ = await self._client().list_pods(
            field_selector=field_selector, label_selector=label_selector
        )
        return pods

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod:
        return await self._writer().patch_pod_annotations(namespace, name, annotations)

    async def patch_pod_labels(
        self, namespace: str, name: str, labels: Mapping[str, str | None]
    ) -> None:
        await self._writer().patch_pod_labels(namespace, name, labels)

    async def resize_pod_cpu(
        self, namespace: str, name: str, *, container: str, cpu: str, memory: str | None = None
    ) -> Pod:
        return await self._writer().resize_pod_cpu(
            namespace, name, container=container, cpu=cpu, memory=memory
        )

    async def create_event(
        self,
        involved: ObjectReference,
        *,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        component: str,
        host: str | None = None,
    ) -> None:
        await self._writer().create_event(
            involved, reason=reason, message=message, type=type, component=component, host=host
        )

    async def create_virtual_machine_migration(self, migration: VirtualMachineMigration) -> None:
        await self._writer().create_virtual_machine_migration(migration)

    async def evict_pod(self, namespace: str, name: str, *, uid: str) -> None:
        await self._writer().evict_pod(namespace, name, uid=uid)

    async def taint_node(self, name: str, taint: Taint) -> Node:
        return await self._writer().taint_node(name, taint)

    async def review_token(self, token: str, *, audiences: Sequence[str]) -> TokenReviewResult:
        return await self._client().review_token(token, audiences=audiences)

    async def review_access(
        self, user: str, *, groups: Sequence[str], uid: str | None, path: str, verb: str
    ) -> SubjectAccessReviewStatus:
        return await self._client().review_access(
            user, groups=groups, uid=uid, path=path, verb=verb
        )
