"""``KubeClient``: the only code that talks to the Kubernetes API.

Shell: thin I/O, no policy. It sends one request per method, decodes the answer into the frozen
``protocol.kube`` structs, and turns every failure into a typed ``kube_io.errors`` exception,
so that nobody above it inspects an HTTP status. It must not retry (callers know whether a
retry makes sense; the watch does its own), cache objects, or hold any scheduling state.

Why not the generated kubernetes-asyncio API classes: their models are built attribute by
attribute in Python, which is far too slow for a 50k-pod list or a busy watch, and the generated
``create_namespaced_binding`` fails to decode the API's 201 answer (a ``Status``, not a
Binding; see shared/reference/kube/README.md) *although the bind happened*. So
kubernetes-asyncio is used for configuration (kubeconfig / in-cluster, TLS, token refresh) and
transport only: every call goes out on its aiohttp session with its credentials (``_send``),
msgspec encodes the body and decodes the answer's bytes.
"""

from __future__ import annotations

import datetime
import urllib.request
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import (
    ConfigException,
    load_incluster_config,
    new_client_from_config,
)

from kube_io.errors import (
    BadResponse,
    Gone,
    NotFound,
    NotSupported,
    Unavailable,
    error_from_response,
)
from kube_io.objects import (
    Binding,
    BindingMeta,
    Event,
    EventMeta,
    EventSource,
    Lease,
    NonResourceAttributes,
    ObjectReference,
    SubjectAccessReview,
    SubjectAccessReviewRequest,
    SubjectAccessReviewSpec,
    SubjectAccessReviewStatus,
    TokenReview,
    TokenReviewRequest,
    TokenReviewResult,
    TokenReviewSpec,
)
from protocol.codec import ProtocolError, decode
from protocol.kube import (
    Node,
    NodeList,
    Pod,
    PodList,
    Service,
    ServiceList,
    Taint,
    WatchEvent,
)
from protocol.virtualmachine import API_VERSION as VM_API_VERSION
from protocol.virtualmachine import MIGRATION_PLURAL as VMM_PLURAL
from protocol.virtualmachine import PLURAL as VM_PLURAL
from protocol.virtualmachine import (
    VirtualMachine,
    VirtualMachineList,
    VirtualMachineMigration,
    VirtualMachineMigrationList,
    VirtualMachineMigrationStatus,
    VirtualMachineStatus,
    migration_manifest,
)

__all__ = ["DEFAULT_PAGE_SIZE", "KubeClient", "ResourceKind"]

ResourceKind = Literal["pods", "nodes", "virtualmachines", "virtualmachinemigrations", "services"]

DEFAULT_PAGE_SIZE: Final = 500
"""Items per list page: the API server's own recommendation; bounds one response's memory."""

_PATHS: Final[dict[ResourceKind, str]] = {
    "pods": "/api/v1/pods",
    "nodes": "/api/v1/nodes",
    "virtualmachines": f"/apis/{VM_API_VERSION}/{VM_PLURAL}",
    "virtualmachinemigrations": f"/apis/{VM_API_VERSION}/{VMM_PLURAL}",
    "services": "/api/v1/services",
}
_JSON: Final = "application/json"
_MERGE_PATCH: Final = "application/merge-patch+json"
_JSON_PATCH: Final = "application/json-patch+json"
_STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
# An expired ``continue`` token (410) restarts the whole list; more than this means the
# cluster compacts faster than we can page, which no retry here will fix.
_LIST_RESTARTS: Final = 2
_ENCODER: Final = msgspec.json.Encoder()

# Upstream leaves it unannotated; typing it once here keeps the call sites strict.
_load_incluster_config: Callable[..., None] = load_incluster_config

_L = TypeVar("_L", PodList, NodeList, VirtualMachineList, VirtualMachineMigrationList, ServiceList)
_T = TypeVar("_T")


class KubeClient:
    """A connection to one API server. Create with ``connect`` or ``for_url``; ``close`` it."""

    def __init__(
        self,
        api: ApiClient,
        *,
        request_timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 10.0,
        user_agent: str = "vm-autoscaling/kube_io",
    ) -> None:
        self._api = api
        self._request_timeout = aiohttp.ClientTimeout(
            total=request_timeout_seconds, sock_connect=connect_timeout_seconds
        )
        self._connect_timeout_seconds = connect_timeout_seconds
        # Who sends each request, as the API server's audit log and metrics show it.
        api.user_agent = user_agent
        _skip_env_lookups(api)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None,
        *,
        context: str | None = None,
        user_agent: str = "vm-autoscaling/kube_io",
    ) -> KubeClient:
        """From a kubeconfig file, or from the pod's service account when ``kubeconfig`` is None.

        In-cluster, kubernetes-asyncio re-reads the (rotated) token file before requests.
        Raises ``kubernetes_asyncio.config.ConfigException`` when there is no usable config: that
        is a deployment error for ``__main__`` to report, not an API error.
        """
        if kubeconfig is None:
            configuration = Configuration()
            # It fills ``configuration`` and installs the hook that re-reads the rotated token.
            _load_incluster_config(client_configuration=configuration)
            return cls(ApiClient(configuration), user_agent=user_agent)
        # persist_config=False: never write refreshed credentials back into the user's file.
        api = await new_client_from_config(
            config_file=kubeconfig, context=context, persist_config=False
        )
        return cls(api, user_agent=user_agent)

    @classmethod
    def for_url(
        cls,
        base_url: str,
        *,
        token: str | None = None,
        request_timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 10.0,
    ) -> KubeClient:
        """A plain ``http(s)://host:port`` and optional bearer token (tests, standalone runs).

        Must be called inside a running event loop (aiohttp binds its session to it).
        """
        configuration = Configuration(host=base_url.rstrip("/"))
        if token is not None:
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return cls(
            ApiClient(configuration),
            request_timeout_seconds=request_timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
        )

    @property
    def server_url(self) -> str:
        """The API server's address, as the kubeconfig or the pod's environment gave it."""
        return str(self._api.configuration.host)

    async def server_version(self, *, timeout_seconds: float) -> str:
        """GET /version (readable by every authenticated user): does the API server answer?

        Raises ``Unavailable`` when nothing answers within ``timeout_seconds`` and
        ``Unauthorized`` when it refuses the credentials.
        """
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        response = await self._send("GET", "/version", client_timeout=timeout)
        async with response:
            await _raise_for_status(response)
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise Unavailable(f"GET /version: reading the answer failed: {e!r}") from e
        try:
            version = msgspec.json.decode(data, type=dict[str, Any])
        except msgspec.DecodeError:
            return ""  # it answered; what it says about itself does not matter here
        return str(version.get("gitVersion", ""))

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- lists ----------------------------------------------------------------------------

    async def list_pods(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[Pod], str]:
        """All matching pods and the list's resourceVersion (where a watch continues)."""
        pages = await self._list(
            "pods", PodList, field_selector, label_selector, page_size=page_size
        )
        return [pod for page in pages for pod in page.items or ()], pages[
            -1
        ].metadata.resource_version

    async def list_nodes(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[Node], str]:
        """All matching nodes and the list's resourceVersion."""
        pages = await self._list(
            "nodes", NodeList, field_selector, label_selector, page_size=page_size
        )
        items = [node for page in pages for node in page.items or ()]
        return items, pages[-1].metadata.resource_version

    async def list_virtual_machines(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[VirtualMachine], str]:
        """All matching VirtualMachines (every namespace) and the list's resourceVersion."""
        pages = await self._list(
            "virtualmachines",
            VirtualMachineList,
            field_selector,
            label_selector,
            page_size=page_size,
        )
        items = [vm for page in pages for vm in page.items or ()]
        return items, pages[-1].metadata.resource_version

    async def list_virtual_machine_migrations(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[VirtualMachineMigration], str]:
        """All matching VirtualMachineMigrations (every namespace) and the resourceVersion."""
        pages = await self._list(
            "virtualmachinemigrations",
            VirtualMachineMigrationList,
            field_selector,
            label_selector,
            page_size=page_size,
        )
        items = [vmm for page in pages for vmm in page.items or ()]
        return items, pages[-1].metadata.resource_version

    async def list_services(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[Service], str]:
        """All matching Services (every namespace) and the list's resourceVersion."""
        pages = await self._list(
            "services", ServiceList, field_selector, label_selector, page_size=page_size
        )
        items = [service for page in pages for service in page.items or ()]
        return items, pages[-1].metadata.resource_version

    async def _list(
        self,
        kind: ResourceKind,
        list_type: type[_L],
        field_selector: str | None,
        label_selector: str | None,
        *,
        page_size: int,
    ) -> list[_L]:
        selectors: list[tuple[str, str]] = _selectors(field_selector, label_selector)
        restarts = 0
        while True:
            pages: list[_L] = []
            continue_token: str | None = None
            try:
                while True:
                    query: list[tuple[str, str]] = [*selectors, ("limit", str(page_size))]
                    if continue_token:
                        query.append(("continue", continue_token))
                    _, body = await self._call("GET", _PATHS[kind], query=query)
                    page = _decode(list_type, body)
                    pages.append(page)
                    continue_token = page.metadata.continue_
                    if not continue_token:
                        return pages
            except Gone:
                # All pages of one list come from one snapshot; once that snapshot is compacted
                # the pages we hold cannot be completed, only started over.
                if continue_token is None or restarts >= _LIST_RESTARTS:
                    raise
                restarts += 1

    # --- watch ----------------------------------------------------------------------------

    async def watch_events(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncGenerator[WatchEvent, None]:
        """The raw events of one watch stream, until the server ends it.

        Interpreting them (bookmarks, ERROR events, resuming) is ``kube_io.watch``'s job.
        ``timeout_seconds`` asks the server to end the stream; the client gives up if nothing
        at all (not even a bookmark) arrives for a minute longer than that.
        Close the iterator (``contextlib.aclosing``) to release the connection early.
        """
        query = [
            *_selectors(field_selector, label_selector),
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._connect_timeout_seconds,
            sock_read=timeout_seconds + 60,
        )
        response = await self._send("GET", _PATHS[kind], query=query, client_timeout=timeout)
        async with response:
            await _raise_for_status(response)
            try:
                async for line in response.content:
                    if line.strip():
                        yield _decode(WatchEvent, line)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise Unavailable(f"watch stream of {kind} broke: {e!r}") from e

    async def get_pod(self, namespace: str, name: str) -> Pod:
        """One pod as the API server has it now. Raises ``NotFound``."""
        _, body = await self._call("GET", _pod_path(namespace, name))
        return _decode(Pod, body)

    async def get_service(self, namespace: str, name: str) -> Service:
        """One Service as the API server has it now. Raises ``NotFound``."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(name, safe='')}"
        _, body = await self._call("GET", path)
        return _decode(Service, body)

    # --- writes ---------------------------------------------------------------------------

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        node: str,
        resource_version: str | None = None,
    ) -> None:
        """Bind the pod to ``node``, only if it still has ``uid`` (and ``resource_version``).

        Raises ``Conflict`` (already bound, or a precondition failed) and ``NotFound``, each
        with the API's message.
        """
        binding = Binding(
            api_version="v1",
            kind="Binding",
            metadata=BindingMeta(
                name=name, namespace=namespace, uid=uid, resource_version=resource_version
            ),
            target=ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # 201 with a Status body: success. The body carries nothing else we need.
        await self._call("POST", f"{_pod_path(namespace, name)}/binding", body=binding)

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Pod:
        """JSON merge patch of annotations; a None value removes that key. Returns the pod."""
        patch = {"metadata": {"annotations": dict(annotations)}}
        _, body = await self._call(
            "PATCH", _pod_path(namespace, name), body=patch, content_type=_MERGE_PATCH
        )
        return _decode(Pod, body)

    async def create_namespaced(self, plural_path: str, manifest: Mapping[str, Any]) -> None:
        """POST ``manifest`` to its namespace's collection ``plural_path`` (``pods``,
        ``services``: core/v1 only). Raises ``Conflict`` when the name is taken."""
        namespace = quote(str(manifest["metadata"]["namespace"]), safe="")
        await self._call(
            "POST", f"/api/v1/namespaces/{namespace}/{plural_path}", body=dict(manifest)
        )

    async def create_virtual_machine_migration(self, migration: VirtualMachineMigration) -> None:
        """POST a VirtualMachineMigration to its namespace. Raises ``Conflict`` when the name
        is taken (a retry of a create that landed)."""
        namespace = quote(migration.metadata.namespace, safe="")
        await self._call(
            "POST",
            f"/apis/{VM_API_VERSION}/namespaces/{namespace}/{VMM_PLURAL}",
            body=migration_manifest(migration),
        )

    async def evict_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Evict the pod through the Eviction API (policy/v1, the pod's ``eviction``
        subresource), only if it is still the one with ``uid``: the API server deletes it if
        its PodDisruptionBudget allows a disruption now. Raises ``TooManyRequests`` when it
        does not (try again later: never delete the pod instead), ``NotFound`` when the pod is
        gone (another pod may have its name now), ``Conflict`` when another pod took its name
        in the moment between the read and the eviction.

        The pod is read first: the API server applies the eviction's uid precondition only
        when it deletes, after it has taken a disruption from the budget of the pod now under
        that name (kubernetes/kubernetes ``pkg/registry/core/pod/storage/eviction.go``,
        ``EvictionREST.Create``: ``checkAndDecrement``, then ``store.Delete``), so an eviction
        meant for a replaced pod would spend its successor's disruption until the disruption
        controller gave up on it (``DeletionTimeout``, 2 minutes)."""
        pod = await self.get_pod(namespace, name)
        if pod.metadata.uid != uid:
            raise NotFound(
                f"pod {namespace}/{name} {uid} is gone: the pod of that name is {pod.metadata.uid}",
                status=404,
                reason="NotFound",
            )
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        await self._call("POST", f"{_pod_path(namespace, name)}/eviction", body=eviction)

    async def taint_node(self, name: str, taint: Taint) -> Node:
        """Add ``taint`` to the node unless one of its key and effect is there; the node as
        the API server has it after. A JSON patch tested against the resourceVersion just
        read: the other taints are left exactly as they are (a merge patch would rewrite the
        whole list). Raises ``Conflict`` when the node changed in between (read again)."""
        path = f"/api/v1/nodes/{quote(name, safe='')}"
        _, body = await self._call("GET", path)
        node = _decode(Node, body)
        taints = node.spec.taints or []
        if any(t.key == taint.key and t.effect == taint.effect for t in taints):
            return node
        added = msgspec.to_builtins(taint)
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion",
             "value": node.metadata.resource_version},
            {"op": "add", "path": "/spec/taints/-", "value": added}
            if taints
            else {"op": "add", "path": "/spec/taints", "value": [added]},
        ]  # fmt: skip
        _, body = await self._call("PATCH", path, body=ops, content_type=_JSON_PATCH)
        return _decode(Node, body)

    async def delete_pod(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete the pod only if it is still the one with ``uid`` (a precondition: a newer pod
        of the same name is never deleted by mistake). Raises ``NotFound``, ``Conflict``."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call("DELETE", _pod_path(namespace, name), body=options)

    async def patch_virtual_machine_status(
        self, namespace: str, name: str, status: VirtualMachineStatus
    ) -> None:
        """Replace the status subresource's fields with ``status`` (a JSON merge patch that
        names every field, so a field now unset is removed rather than kept)."""
        await self._patch_status(VM_PLURAL, namespace, name, status)

    async def patch_virtual_machine_migration_status(
        self, namespace: str, name: str, status: VirtualMachineMigrationStatus
    ) -> None:
        """As ``patch_virtual_machine_status``, for a VirtualMachineMigration."""
        await self._patch_status(VMM_PLURAL, namespace, name, status)

    async def _patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: VirtualMachineStatus | VirtualMachineMigrationStatus,
    ) -> None:
        written = msgspec.to_builtins(status)
        fields = {f.encode_name for f in msgspec.structs.fields(status)}
        patch = {"status": {key: written.get(key) for key in sorted(fields)}}
        path = (
            f"/apis/{VM_API_VERSION}/namespaces/{quote(namespace, safe='')}/{plural}/"
            f"{quote(name, safe='')}/status"
        )
        await self._call("PATCH", path, body=patch, content_type=_MERGE_PATCH)

    async def patch_pod_labels(
        self, namespace: str, name: str, labels: Mapping[str, str | None]
    ) -> None:
        """JSON merge patch of labels; a None value removes that key."""
        patch = {"metadata": {"labels": dict(labels)}}
        await self._call("PATCH", _pod_path(namespace, name), body=patch, content_type=_MERGE_PATCH)

    async def patch_service_selector(
        self, namespace: str, name: str, selector: Mapping[str, str | None]
    ) -> None:
        """JSON merge patch of a Service's selector; a None value removes that key."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(name, safe='')}"
        patch = {"spec": {"selector": dict(selector)}}
        await self._call("PATCH", path, body=patch, content_type=_MERGE_PATCH)

    async def get_lease(self, namespace: str, name: str) -> Lease:
        """Raises ``NotFound`` when there is none yet."""
        _, body = await self._call("GET", _lease_path(namespace, name))
        return _decode(Lease, body)

    async def create_lease(self, lease: Lease) -> Lease:
        """Raises ``Conflict`` (409 AlreadyExists) when another got there first."""
        meta = lease.metadata
        _, body = await self._call("POST", _lease_path(meta.namespace, ""), body=lease)
        return _decode(Lease, body)

    async def replace_lease(self, lease: Lease) -> Lease:
        """PUT under ``metadata.resourceVersion``: ``Conflict`` if the Lease changed since."""
        meta = lease.metadata
        _, body = await self._call("PUT", _lease_path(meta.namespace, meta.name), body=lease)
        return _decode(Lease, body)

    async def resize_pod_cpu(
        self,
        namespace: str,
        name: str,
        *,
        container: str,
        cpu: str,
        memory: str | None = None,
    ) -> Pod:
        """Set one container's CPU (and memory) request and limit in place, via ``pods/resize``.

        Requests and limits move together: a Guaranteed pod must stay Guaranteed (the API
        rejects a resize that changes the QoS class). Raises ``NotSupported`` when the cluster
        has no resize subresource (before in-place resize), ``NotFound`` when the pod is gone.
        """
        resources = {"cpu": cpu} if memory is None else {"cpu": cpu, "memory": memory}
        # Strategic merge: containers merge by name, so the other containers stay untouched.
        patch = {
            "spec": {
                "containers": [
                    {"name": container, "resources": {"requests": resources, "limits": resources}}
                ]
            }
        }
        try:
            _, body = await self._call(
                "PATCH",
                f"{_pod_path(namespace, name)}/resize",
                body=patch,
                content_type=_STRATEGIC_MERGE_PATCH,
            )
        except NotFound as e:
            # A missing pod names itself in ``details``; a missing route has empty details.
            if e.details is None or e.details.name != name:
                raise NotSupported(
                    f"in-place pod resize is not supported by this cluster: {e.message}",
                    status=e.status,
                    reason=e.reason,
                    details=e.details,
                ) from e
            raise
        return _decode(Pod, body)

    async def create_event(
        self,
        involved: ObjectReference,
        *,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",  # the API's own field name
        component: str,
        host: str | None = None,
    ) -> None:
        """Record a ``core/v1`` Event about ``involved`` (shown by ``kubectl describe``).

        Cluster-scoped objects (nodes) get their events in ``default``, as the kubelet does.
        """
        namespace = involved.namespace or "default"
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = Event(
            api_version="v1",
            kind="Event",
            metadata=EventMeta(namespace=namespace, generate_name=f"{involved.name}."),
            involved_object=involved,
            reason=reason,
            message=message,
            type=type,
            source=EventSource(component=component, host=host),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component=component,
            reporting_instance=host,
        )
        await self._call(
            "POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body=event
        )

    async def review_token(self, token: str, *, audiences: Sequence[str]) -> TokenReviewResult:
        """Ask the API who ``token`` belongs to, for these audiences.

        An invalid token is *not* an error: the result says ``authenticated=False`` with the
        API's reason. Errors mean the review itself failed (e.g. ``Forbidden`` without the
        ``system:auth-delegator`` role).
        """
        review = TokenReviewRequest(
            api_version="authentication.k8s.io/v1",
            kind="TokenReview",
            spec=TokenReviewSpec(token=token, audiences=list(audiences)),
        )
        _, body = await self._call(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=review
        )
        return TokenReviewResult.from_review(_decode(TokenReview, body))

    async def review_access(
        self,
        user: str,
        *,
        groups: Sequence[str],
        uid: str | None,
        path: str,
        verb: str,
    ) -> SubjectAccessReviewStatus:
        """Ask the API's authorizers whether ``user`` may ``verb`` the non-resource ``path``.

        A refusal is *not* an error (``allowed`` is false, ``reason`` says why when the
        authorizer gave one). Errors mean the review itself failed (e.g. ``Forbidden`` without
        the ``system:auth-delegator`` role).
        """
        review = SubjectAccessReviewRequest(
            api_version="authorization.k8s.io/v1",
            kind="SubjectAccessReview",
            spec=SubjectAccessReviewSpec(
                non_resource_attributes=NonResourceAttributes(path=path, verb=verb),
                user=user,
                groups=list(groups) or None,
                uid=uid,
            ),
        )
        _, body = await self._call(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
        )
        return _decode(SubjectAccessReview, body).status

    # --- transport ------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: msgspec.Struct | dict[str, Any] | list[dict[str, Any]] | None = None,
        content_type: str = _JSON,
    ) -> tuple[int, bytes]:
        """One request whose whole answer is read; non-2xx become typed errors."""
        response = await self._send(method, path, query=query, body=body, content_type=content_type)
        async with response:
            await _raise_for_status(response)
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise Unavailable(f"{method} {path}: reading the answer failed: {e!r}") from e
            return response.status, data

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: msgspec.Struct | dict[str, Any] | list[dict[str, Any]] | None = None,
        content_type: str = _JSON,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """One request on kubernetes-asyncio's session, with its credentials and settings.

        Not through ``ApiClient.call_api``: for a body already typed, it walked the body
        (``sanitize_for_serialization``), ``json.dumps``ed it and rebuilt the headers, URL and
        timeout on every call: Python the extender's loop, which also answers kube-scheduler's
        filter calls, spent on every Binding POST (docs/DEPLOY.md has the figures). What it
        applied is applied here from the same public pieces: the configuration's host and
        bearer token (``auth_settings``, which runs the refresh hook of an in-cluster or
        exec-plugin token), the client's default headers (the user agent), the REST client's
        proxy and TLS server name, and the query encoded as it did (``urlencode``); the body is
        encoded once, by msgspec.
        """
        api = self._api
        rest = api.rest_client
        url = f"{api.configuration.host}{path}"
        if query:
            url = f"{url}?{urlencode(query)}"
        headers = {**api.default_headers, "Accept": _JSON, "Content-Type": content_type}
        options: dict[str, Any] = {}
        if rest.proxy:
            options["proxy"] = rest.proxy
            if rest.proxy_headers:
                options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        try:
            token = (await api.configuration.auth_settings()).get("BearerToken")
            if token is not None:
                headers[token["key"]] = token["value"]
            response: aiohttp.ClientResponse = await rest.pool_manager.request(
                method,
                url,
                data=None if body is None else _ENCODER.encode(body),
                headers=headers,
                timeout=client_timeout or self._request_timeout,
                **options,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"{method} {path}: {e!r}") from e
        except ConfigException as e:
            # A token file that vanished or an exec plugin that failed: no request was sent.
            raise Unavailable(f"{method} {path}: credentials unavailable: {e}") from e
        return response


def _skip_env_lookups(api: ApiClient) -> None:
    """Swap kubernetes-asyncio's session (``trust_env=True``) for one that does not look up a
    proxy and ``~/.netrc`` on every request.

    With ``trust_env``, aiohttp resolves both per request, each in a thread of the default
    executor: two thread hops and GIL hand-overs for every Binding POST, where the extender's
    event loop also answers kube-scheduler's filter calls. The environment does not change
    while the process runs, so it is read once here: when a proxy applies to the API server,
    the session is left as it was (aiohttp keeps honouring the proxy variables); otherwise
    the new session has no env lookups. ``~/.netrc`` is not an API credential (the kubeconfig
    or the ServiceAccount token is; kubectl ignores ``.netrc`` too).
    """
    rest = api.rest_client
    if _env_proxy_applies(str(api.configuration.host)):
        return
    old: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector,
        trust_env=False,
        # kubernetes-asyncio's own choice: one watch event may be a large object.
        read_bufsize=2**21,
    )
    old.detach()  # the connector now belongs to the new session


def _env_proxy_applies(url: str) -> bool:
    """Would aiohttp's ``trust_env`` send requests to ``url`` through a proxy?"""
    parts = urlsplit(url)
    if parts.scheme not in urllib.request.getproxies():
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if 200 <= response.status < 300:
        return
    try:
        data = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError):
        data = b""  # The status alone still classifies the error.
    raise error_from_response(
        response.status, data, retry_after=response.headers.get("Retry-After")
    )


def _decode(type_: type[_T], data: bytes) -> _T:
    try:
        return decode(type_, data)
    except ProtocolError as e:
        raise BadResponse(f"cannot decode {type_.__name__}: {e}") from e


def _selectors(field_selector: str | None, label_selector: str | None) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if label_selector:
        query.append(("labelSelector", label_selector))
    return query


def _lease_path(namespace: str, name: str) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return f"{base}/{quote(name, safe='')}" if name else base


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
