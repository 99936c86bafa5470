"""``KubeLink``: the extender's handle on a ``KubeClient`` that is connected later.

Shell. The app is built before the event loop runs (aiohttp's factories), but a ``KubeClient``
can only be made inside the loop; the app's ``cleanup_ctx`` connects it. Until then (and after
close) every call raises ``kube_io.errors.Unavailable``, which callers already treat as
"retry later". Each method is the ``KubeClient`` method of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from kube_io.client import KubeClient
from kube_io.errors import Unavailable
from kube_io.objects import ObjectReference, SubjectAccessReviewStatus, TokenReviewResult
from protocol.kube import Pod


class KubeLink:
    def __init__(self) -> None:
        self.client: KubeClient | None = None

    def _client(self) -> KubeClient:
        if self.client is None:
            raise Unavailable("not connected to the Kubernetes API")
        return self.client

    async def get_pod(self, namespace: str, name: str) -> Pod:
        return await self._client().get_pod(namespace, name)

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, resource_version: str | None
    ) -> None:
        await self._client().bind_pod(
            namespace, name, uid=uid, node=node, resource_version=resource_version
        )

    async def list_pods(self, *, field_selector: str) -> list[Pod]:
        pods, _ = await self._client().list_pods(field_selector=field_selector)
        return pods

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod:
        return await self._client().patch_pod_annotations(namespace, name, annotations)

    async def resize_pod_cpu(
        self, namespace: str, name: str, *, container: str, cpu: str, memory: str | None = None
    ) -> Pod:
        return await self._client().resize_pod_cpu(
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
        await self._client().create_event(
            involved, reason=reason, message=message, type=type, component=component, host=host
        )

    async def review_token(self, token: str, *, audiences: Sequence[str]) -> TokenReviewResult:
        return await self._client().review_token(token, audiences=audiences)

    async def review_access(
        self, user: str, *, groups: Sequence[str], uid: str | None, path: str, verb: str
    ) -> SubjectAccessReviewStatus:
        return await self._client().review_access(
            user, groups=groups, uid=uid, path=path, verb=verb
        )
