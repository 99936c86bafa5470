"""A small fake kube-apiserver over real HTTP on 127.0.0.1, for tests of anything that talks to it.

It answers like the v1.36 samples in tests/reference/kube/api/ (the tests in
tests/kube_io/test_fake_kube_api.py hold it to them): lists with ``kind``/``apiVersion``/
``metadata.resourceVersion`` and ``limit``/``continue`` paging, watch streams as JSON lines with
ADDED/MODIFIED/DELETED/BOOKMARK, a 200 stream with one ``ERROR`` 410 ``Expired`` event for a
compacted resourceVersion, Binding's 201 Status and its 404/409 messages, annotation merge
patches, the ``pods/resize`` subresource, Events and TokenReviews.

It must not grow policy or cleverness: it is a test peer, not a second implementation of our
code. Objects are plain JSON dicts (what the API sends), so any field survives untouched.

Use::

    async with FakeKubeApi() as api:            # or: api = FakeKubeApi(); await api.start()
        api.add_node(node_object("node-a", cpu="4"))
        pod = api.add_pod(pod_object("vm-1", namespace="vms", labels={"app": "pg"}))
        api.add_token("agent-token", TokenIdentity(username="system:serviceaccount:ns:agent",
                      node_name="node-a", pod_name="agent-1"))
        client = KubeClient.for_url(api.url)
        ...
        api.update_pod("vms", "vm-1", lambda p: p["metadata"]["labels"].update(x="y"))
        api.delete_pod("vms", "vm-1")
        api.close_watches(abort=True)      # drop every open stream (abort=False: clean end)
        api.compact()                      # watches from older versions now get 410 Expired
        api.fail_next(503, path="/api/v1/pods")
        assert api.requests[-1].path == "/api/v1/pods"
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from protocol.quantity import cpu_millis, memory_bytes

Obj = dict[str, Any]
Kind = Literal["pods", "nodes"]
# (kind, list resourceVersion, namespace, fieldSelector, labelSelector): one paginated list.
_SnapshotKey = tuple[Kind, int, str | None, str, str]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

_KIND_NAMES: dict[Kind, str] = {"pods": "Pod", "nodes": "Node"}
_CLOSE = "close"
_ABORT = "abort"

# A bookmark's object is the zero value of the Go type with only the resourceVersion set.
_BOOKMARK_BODIES: dict[Kind, Obj] = {
    "pods": {"spec": {"containers": None}, "status": {}},
    "nodes": {
        "spec": {},
        "status": {
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                key: ""
                for key in (
                    "machineID",
                    "systemUUID",
                    "bootID",
                    "kernelVersion",
                    "osImage",
                    "containerRuntimeVersion",
                    "kubeletVersion",
                    "kubeProxyVersion",
                    "operatingSystem",
                    "architecture",
                )
            },
        },
    },
}


def dumps(value: Any) -> bytes:
    # Go's encoder: compact, UTF-8 as is. Key order is the dicts' order, built like the API's.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(
    code: int, reason: str, message: str, *, details: Obj | None = None, success: bool = False
) -> Obj:
    """A ``meta/v1 Status`` with the API's key order (see binding-404-no-pod.txt)."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    if success:
        body |= {"status": "Success", "code": code}
        return body
    body |= {"status": "Failure", "message": message, "reason": reason}
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def status_response(
    code: int, reason: str, message: str, *, details: Obj | None = None
) -> web.Response:
    return web.Response(
        status=code,
        body=dumps(status_body(code, reason, message, details=details)),
        content_type="application/json",
    )


# --- in-place resize validation -----------------------------------------------------------


def _quantity(resource: str, value: str) -> int:
    return cpu_millis(value) if resource == "cpu" else memory_bytes(value)


def _qos_class(pod: Obj) -> str:
    """Kubernetes' QoS class of a pod's containers (cpu and memory only)."""
    containers = pod["spec"]["containers"]
    is_guaranteed, is_empty = True, True
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        is_empty = is_empty and not requests and not limits
        for r in ("cpu", "memory"):
            limit = limits.get(r)
            request = requests.get(r, limit)
            if limit is None or request is None or _quantity(r, request) != _quantity(r, limit):
                is_guaranteed = False
    return "BestEffort" if is_empty else "Guaranteed" if is_guaranteed else "Burstable"


def _resize_causes(old: Obj, new: Obj) -> list[tuple[str, str]]:
    """Why kube-apiserver refuses a resize: a request above its limit, a changed QoS class."""
    causes = []
    for i, c in enumerate(new["spec"]["containers"]):
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for r in ("cpu", "memory"):
            if (
                r in requests
                and r in limits
                and _quantity(r, requests[r]) > _quantity(r, limits[r])
            ):
                causes.append(
                    (
                        f"spec.containers[{i}].resources.requests",
                        f'Invalid value: "{requests[r]}": must be less than or equal to'
                        f" {r} limit of {limits[r]}",
                    )
                )
    before = _qos_class(old)
    if _qos_class(new) != before:
        causes.append(
            (
                "spec",
                f'Invalid value: "{before}": Pod QOS Class may not change as a result of resizing',
            )
        )
    return causes


# --- object builders ----------------------------------------------------------------------


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    container: str = "vm",
    cpu: str = "1",
    memory: str = "1Gi",
    scheduler_name: str = "vm-scheduler",
    phase: str = "Pending",
) -> Obj:
    """A pod shaped like list-pods.json's item (resourceVersion is set when it is added)."""
    metadata: Obj = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())}
    if labels:
        metadata["labels"] = dict(sorted(labels.items()))
    if annotations:
        metadata["annotations"] = dict(sorted(annotations.items()))
    spec: Obj = {
        "containers": [
            {
                "name": container,
                "image": "example/vm-runner:1",
                "resources": {
                    "limits": {"cpu": cpu, "memory": memory},
                    "requests": {"cpu": cpu, "memory": memory},
                },
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    spec |= {"securityContext": {}, "schedulerName": scheduler_name, "priority": 0}
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "qosClass": "Guaranteed"},
    }


def node_object(
    name: str,
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    labels: dict[str, str] | None = None,
    uid: str | None = None,
    ready: bool = True,
) -> Obj:
    """A node shaped like node.json (hand-made: no kubelet fills nodeInfo)."""
    resources = {"cpu": cpu, "ephemeral-storage": "50Gi", "memory": memory, "pods": "110"}
    all_labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        **(labels or {}),
    }
    return {
        "metadata": {
            "name": name,
            "uid": uid or str(uuid.uuid4()),
            "labels": dict(sorted(all_labels.items())),
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": "FakeReady",
                    "message": "created by hand",
                }
            ],
            "phase": "Running",
        },
    }


@dataclass(frozen=True, kw_only=True)
class TokenIdentity:
    """Who a token belongs to, as a TokenReview reports it (see tokenreview-ok.json)."""

    username: str
    uid: str = "d288229f-5a36-481d-94fe-28d5d8e963cb"
    groups: tuple[str, ...] = ("system:serviceaccounts", "system:authenticated")
    audiences: tuple[str, ...] = ("vm-autoscaling-extender",)
    node_name: str | None = None
    node_uid: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    authorization: str | None
    body: Any  # the decoded JSON body, or None


@dataclass(kw_only=True)
class _Injected:
    status: int
    method: str | None
    path: str | None
    times: int
    message: str


@dataclass(frozen=True)
class _Change:
    resource_version: int
    kind: Kind
    type: EventType
    old: Obj | None
    new: Obj


@dataclass(eq=False)
class _Stream:
    kind: Kind
    namespace: str | None
    matches: Callable[[Obj], bool]
    has_bookmarks: bool
    queue: asyncio.Queue[tuple[str, Obj] | str] = field(default_factory=asyncio.Queue)


# --- selectors ----------------------------------------------------------------------------


def _field_value(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _parse_requirements(selector: str) -> Iterator[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` as (key, op, value) with op in ``= != exists !exists``."""
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            yield key.strip(), "!=", value.strip()
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            yield key.strip(), "=", value.strip()
        elif term.startswith("!"):
            yield term[1:].strip(), "!exists", None
        else:
            yield term, "exists", None


def field_matcher(selector: str | None) -> Callable[[Obj], bool]:
    requirements = list(_parse_requirements(selector or ""))

    def matches(obj: Obj) -> bool:
        for key, op, value in requirements:
            actual = _field_value(obj, key)
            if (op == "=") != (actual == value):
                return False
        return True

    return matches


def label_matcher(selector: str | None) -> Callable[[Obj], bool]:
    requirements = list(_parse_requirements(selector or ""))

    def matches(obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for key, op, value in requirements:
            ok = {
                "=": labels.get(key) == value,
                "!=": labels.get(key) != value,
                "exists": key in labels,
                "!exists": key not in labels,
            }[op]
            if not ok:
                return False
        return True

    return matches


# --- patches ------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _sort_maps(obj: Obj) -> None:
    # Go encodes maps with sorted keys; keep ours in the same order after every change.
    meta = obj.get("metadata", {})
    for key in ("labels", "annotations"):
        if isinstance(meta.get(key), dict):
            meta[key] = dict(sorted(meta[key].items()))
    for container in obj.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        for key in ("limits", "requests"):
            if isinstance(resources.get(key), dict):
                resources[key] = dict(sorted(resources[key].items()))


# --- the server ---------------------------------------------------------------------------


class FakeKubeApi:
    """In-memory pods, nodes and a resourceVersion counter behind a real aiohttp server.

    ``token``: when set, every request must carry ``Authorization: Bearer <token>`` (else 401).
    ``is_resize_supported``: False makes ``pods/resize`` answer 404 like a pre-1.33 cluster.
    ``is_expired_http_410``: answer a compacted watch with HTTP 410 instead of 200 + ERROR.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        is_resize_supported: bool = True,
        is_expired_http_410: bool = False,
        first_resource_version: int = 100,
    ) -> None:
        self.token = token
        self.is_resize_supported = is_resize_supported
        self.is_expired_http_410 = is_expired_http_410
        self.resource_version = first_resource_version
        self.compacted_resource_version = 0
        self.objects: dict[Kind, dict[tuple[str, str], Obj]] = {"pods": {}, "nodes": {}}
        self.history: list[_Change] = []
        self.events: list[Obj] = []
        self.tokens: dict[str, TokenIdentity] = {}
        self.requests: list[RecordedRequest] = []
        self._streams: list[_Stream] = []
        self._stream_opened = asyncio.Event()
        self._injected: list[_Injected] = []
        self._holds: dict[str, asyncio.Event] = {}
        # Paginated lists answer later pages from the snapshot of their first page, as etcd does.
        # Keyed by everything that shapes a list, not by resourceVersion alone: a node list
        # and a pod list started at the same version must not overwrite each other's pages.
        self._snapshots: dict[_SnapshotKey, list[Obj]] = {}
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._url is not None, "FakeKubeApi is not started"
        return self._url

    async def start(self) -> str:
        app = web.Application(middlewares=[self._middleware])
        ns_pod = "/api/v1/namespaces/{namespace}/pods/{name}"
        app.router.add_get("/api/v1/pods", self._get_pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._get_pods)
        app.router.add_get("/api/v1/nodes", self._get_nodes)
        app.router.add_get(ns_pod, self._get_pod)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch(ns_pod, self._patch_pod)
        app.router.add_post(ns_pod + "/binding", self._bind)
        app.router.add_patch(ns_pod + "/resize", self._resize)
        app.router.add_post("/api/v1/namespaces/{namespace}/events", self._create_event)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._review_token)
        # Watch streams must not delay shutdown: close_watches() ends them, then cleanup.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = self._runner.addresses
        host, port = sockets[0][:2]
        self._url = f"http://{host}:{port}"
        return self._url

    async def stop(self) -> None:
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeKubeApi:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- test helpers: state --------------------------------------------------------------

    def add_pod(self, pod: Obj) -> Obj:
        return self._add("pods", pod)

    def add_node(self, node: Obj) -> Obj:
        return self._add("nodes", node)

    def update_pod(self, namespace: str, name: str, change: Callable[[Obj], object] | Obj) -> Obj:
        """Mutate a pod in place (callable) or merge-patch it (dict); emits MODIFIED."""
        return self._update("pods", (namespace, name), change)

    def update_node(self, name: str, change: Callable[[Obj], object] | Obj) -> Obj:
        return self._update("nodes", ("", name), change)

    def delete_pod(self, namespace: str, name: str) -> Obj:
        return self._delete("pods", (namespace, name))

    def delete_node(self, name: str) -> Obj:
        return self._delete("nodes", ("", name))

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self.objects["pods"][namespace, name]

    def get_node(self, name: str) -> Obj:
        return self.objects["nodes"]["", name]

    def add_token(self, name: str, identity: TokenIdentity) -> str:
        """Make ``fake_jwt(name, audiences=identity.audiences)`` a token of ``identity``."""
        token = fake_jwt(name, audiences=identity.audiences)
        self.tokens[token] = identity
        return token

    # --- test helpers: streams and failures -----------------------------------------------

    @property
    def open_watch_count(self) -> int:
        return len(self._streams)

    async def wait_for_watches(self, count: int = 1, *, timeout_seconds: float = 5.0) -> None:
        """Until at least ``count`` watch streams are open (so events reach a consumer)."""
        async with asyncio.timeout(timeout_seconds):
            while len(self._streams) < count:
                self._stream_opened.clear()
                await self._stream_opened.wait()

    def close_watches(self, *, abort: bool = False) -> None:
        """End every open stream: cleanly (as ``timeoutSeconds`` does) or by dropping the TCP
        connection mid-stream. Events emitted after this call never reach those streams."""
        for stream in self._streams:
            stream.queue.put_nowait(_ABORT if abort else _CLOSE)
        self._streams.clear()

    def send_bookmarks(self) -> None:
        """A BOOKMARK at the current resourceVersion to every stream that allowed them."""
        for stream in self._streams:
            if stream.has_bookmarks:
                stream.queue.put_nowait(("BOOKMARK", self._bookmark_object(stream.kind)))

    def compact(self, resource_version: int | None = None) -> None:
        """Forget history: watches starting below this version get 410 Expired."""
        self.compacted_resource_version = (
            self.resource_version if resource_version is None else resource_version
        )
        self.history = [
            c for c in self.history if c.resource_version > self.compacted_resource_version
        ]
        self._snapshots.clear()

    def fail_next(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        times: int = 1,
        message: str = "fake failure",
    ) -> None:
        """Answer the next ``times`` matching requests with this status and a Status body."""
        self._injected.append(
            _Injected(status=status, method=method, path=path, times=times, message=message)
        )

    def hold(self, path: str) -> asyncio.Event:
        """Requests to ``path`` are recorded, then wait until the returned Event is set: a
        slow answer, for as long as the test says."""
        gate = self._holds[path] = asyncio.Event()
        return gate

    # --- state machinery ------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    @staticmethod
    def _key(kind: Kind, obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace", "default") if kind == "pods" else "", meta["name"])

    def _add(self, kind: Kind, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.setdefault("metadata", {})
        if kind == "pods":
            meta.setdefault("namespace", "default")
            meta.setdefault("generation", 1)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = self._next_rv()
        _sort_maps(obj)
        key = self._key(kind, obj)
        assert key not in self.objects[kind], f"{kind} {key} already exists"
        self.objects[kind][key] = obj
        self._emit(kind, "ADDED", None, obj)
        return obj

    def _update(
        self, kind: Kind, key: tuple[str, str], change: Callable[[Obj], object] | Obj
    ) -> Obj:
        old = self.objects[kind][key]
        if callable(change):
            new = copy.deepcopy(old)
            change(new)
        else:
            new = merge_patch(old, change)
        return self._replace(kind, key, new)

    def _replace(self, kind: Kind, key: tuple[str, str], new: Obj) -> Obj:
        old = self.objects[kind][key]
        new["metadata"]["resourceVersion"] = self._next_rv()
        _sort_maps(new)
        self.objects[kind][key] = new
        self._emit(kind, "MODIFIED", old, new)
        return new

    def _delete(self, kind: Kind, key: tuple[str, str]) -> Obj:
        old = self.objects[kind].pop(key)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", old, gone)
        return gone

    def _emit(self, kind: Kind, type_: EventType, old: Obj | None, new: Obj) -> None:
        change = _Change(int(new["metadata"]["resourceVersion"]), kind, type_, old, new)
        self.history.append(change)
        for stream in self._streams:
            event = self._event_for(stream, change)
            if event is not None:
                stream.queue.put_nowait(event)

    def _event_for(self, stream: _Stream, change: _Change) -> tuple[str, Obj] | None:
        """The event this stream sees: an object that starts (stops) matching its selectors
        is ADDED (DELETED) for it, as the API server does."""
        if change.kind != stream.kind:
            return None

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            ns = obj["metadata"].get("namespace")
            return (stream.namespace is None or ns == stream.namespace) and stream.matches(obj)

        was, now = visible(change.old), visible(change.new)
        if change.type == "DELETED":
            return ("DELETED", self._typed(change.kind, change.new)) if was else None
        if was and now:
            return "MODIFIED", self._typed(change.kind, change.new)
        if now:
            return "ADDED", self._typed(change.kind, change.new)
        if was:
            return "DELETED", self._typed(change.kind, change.new)
        return None

    @staticmethod
    def _typed(kind: Kind, obj: Obj) -> Obj:
        """A single object as the API sends it: ``kind`` and ``apiVersion`` first."""
        return {"kind": _KIND_NAMES[kind], "apiVersion": "v1", **obj}

    def _bookmark_object(self, kind: Kind) -> Obj:
        return {
            "kind": _KIND_NAMES[kind],
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.resource_version)},
            **copy.deepcopy(_BOOKMARK_BODIES[kind]),
        }

    # --- HTTP: middleware -----------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Any],
    ) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                content_type=request.content_type,
                authorization=request.headers.get("Authorization"),
                body=body,
            )
        )
        if self.token is not None and request.headers.get("Authorization") != (
            f"Bearer {self.token}"
        ):
            return status_response(401, "Unauthorized", "Unauthorized")
        gate = self._holds.get(request.path)
        if gate is not None:
            await gate.wait()
        for injected in self._injected:
            if (injected.method in (None, request.method)) and (
                injected.path in (None, request.path)
            ):
                injected.times -= 1
                if injected.times <= 0:
                    self._injected.remove(injected)
                return self._injected_response(injected)
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            # Unknown routes: the API server's generic 404, with empty details.
            return status_response(
                404, "NotFound", "the server could not find the requested resource", details={}
            )
        except web.HTTPMethodNotAllowed:
            return status_response(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        return response

    @staticmethod
    def _injected_response(injected: _Injected) -> web.Response:
        reasons = {
            401: "Unauthorized",
            403: "Forbidden",
            404: "NotFound",
            409: "Conflict",
            410: "Expired",
            422: "Invalid",
            429: "TooManyRequests",
            500: "InternalError",
            503: "ServiceUnavailable",
            504: "Timeout",
        }
        response = status_response(
            injected.status, reasons.get(injected.status, "Unknown"), injected.message
        )
        if injected.status == 429:
            response.headers["Retry-After"] = "1"
        return response

    # --- HTTP: reads ----------------------------------------------------------------------

    async def _get_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "pods", request.match_info.get("namespace"))

    async def _get_nodes(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "nodes", None)

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        pod = self.objects["pods"].get(key)
        if pod is None:
            return _not_found("pods", key[1])
        return _json(200, self._typed("pods", pod))

    async def _get_node(self, request: web.Request) -> web.Response:
        node = self.objects["nodes"].get(("", request.match_info["name"]))
        if node is None:
            return _not_found("nodes", request.match_info["name"])
        return _json(200, self._typed("nodes", node))

    def _matcher(self, request: web.Request) -> Callable[[Obj], bool]:
        by_field = field_matcher(request.query.get("fieldSelector"))
        by_label = label_matcher(request.query.get("labelSelector"))
        return lambda obj: by_field(obj) and by_label(obj)

    async def _list_or_watch(
        self, request: web.Request, kind: Kind, namespace: str | None
    ) -> web.StreamResponse:
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, kind, namespace)
        return self._list(request, kind, namespace)

    def _list(self, request: web.Request, kind: Kind, namespace: str | None) -> web.Response:
        matches = self._matcher(request)
        limit = int(request.query.get("limit", "0") or 0)
        token = request.query.get("continue")
        if token:
            state = json.loads(base64.urlsafe_b64decode(token))
            list_rv, start = int(state["rv"]), int(state["start"])
            snapshot_key = self._snapshot_key(request, kind, namespace, list_rv)
            if snapshot_key not in self._snapshots:
                return status_response(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter.",
                )
            candidates = self._snapshots[snapshot_key]
        else:
            list_rv, start = self.resource_version, 0
            snapshot_key = self._snapshot_key(request, kind, namespace, list_rv)
            candidates = [
                copy.deepcopy(obj)
                for key, obj in sorted(self.objects[kind].items())
                if (namespace is None or key[0] == namespace) and matches(obj)
            ]
        page = candidates[start : start + limit] if limit else candidates[start:]
        metadata: Obj = {"resourceVersion": str(list_rv)}
        remaining = len(candidates) - start - len(page)
        if remaining > 0:
            self._snapshots[snapshot_key] = candidates
            next_token = {"v": "meta.k8s.io/v1", "rv": list_rv, "start": start + len(page)}
            metadata["continue"] = base64.urlsafe_b64encode(dumps(next_token)).decode()
            metadata["remainingItemCount"] = remaining
        list_kind = _KIND_NAMES[kind] + "List"
        return _json(
            200, {"kind": list_kind, "apiVersion": "v1", "metadata": metadata, "items": page}
        )

    @staticmethod
    def _snapshot_key(
        request: web.Request, kind: Kind, namespace: str | None, list_rv: int
    ) -> _SnapshotKey:
        # A continuing client repeats its selectors (client-go does); a different selector at
        # the same version is a different list.
        query = request.query
        return (
            kind,
            list_rv,
            namespace,
            query.get("fieldSelector", ""),
            query.get("labelSelector", ""),
        )

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str | None
    ) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        if since not in ("", "0") and int(since) < self.compacted_resource_version:
            if self.is_expired_http_410:
                return status_response(
                    410,
                    "Expired",
                    f"too old resource version: {since} ({self.compacted_resource_version})",
                )
            # Byte for byte watch-410.txt's line: a 200 stream with one ERROR event.
            response = _stream_response()
            await response.prepare(request)
            expired = status_body(
                410, "Expired", "The resourceVersion for the provided watch is too old."
            )
            await response.write(dumps({"type": "ERROR", "object": expired}) + b"\n")
            await response.write_eof()
            return response

        stream = _Stream(
            kind=kind,
            namespace=namespace,
            matches=self._matcher(request),
            has_bookmarks=request.query.get("allowWatchBookmarks") == "true",
        )
        # No await between computing the backlog and registering: nothing can slip between.
        if since in ("", "0"):
            backlog = [
                ("ADDED", self._typed(kind, obj))
                for key, obj in sorted(self.objects[kind].items())
                if (namespace is None or key[0] == namespace) and stream.matches(obj)
            ]
        else:
            backlog = [
                event
                for change in self.history
                if change.resource_version > int(since)
                and (event := self._event_for(stream, change)) is not None
            ]
        for event in backlog:
            stream.queue.put_nowait(event)
        self._streams.append(stream)
        self._stream_opened.set()
        try:
            return await self._serve_stream(request, stream)
        finally:
            if stream in self._streams:
                self._streams.remove(stream)

    async def _serve_stream(self, request: web.Request, stream: _Stream) -> web.StreamResponse:
        response = _stream_response()
        await response.prepare(request)
        timeout_seconds = float(request.query.get("timeoutSeconds", "1800"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await stream.queue.get()
            except TimeoutError:
                break  # The client's timeoutSeconds: a clean end of the stream.
            if item == _ABORT:
                # Drop the connection mid-stream, as a crashed API server or a proxy would.
                if request.transport is not None:
                    request.transport.abort()
                return response
            if item == _CLOSE:
                break
            assert isinstance(item, tuple)
            event_type, obj = item
            await response.write(dumps({"type": event_type, "object": obj}) + b"\n")
        with contextlib.suppress(ConnectionResetError):
            # The client may have gone while the stream ended (aiohttp's reset is a subclass).
            await response.write_eof()
        return response

    # --- HTTP: writes ---------------------------------------------------------------------

    async def _bind(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        binding = await request.json()
        pod = self.objects["pods"].get((namespace, name))
        if pod is None:
            return _not_found("pods", name)
        wanted_uid = (binding.get("metadata") or {}).get("uid")
        actual_uid = pod["metadata"]["uid"]
        # The storage layer checks the UID precondition before the binding logic runs.
        if wanted_uid and wanted_uid != actual_uid:
            return status_response(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": StorageError: invalid object, '
                f"Code: 4, Key: /registry/pods/{namespace}/{name}, ResourceVersion: 0, "
                f"AdditionalErrorMsg: Precondition failed: UID in precondition: {wanted_uid}, "
                f"UID in object meta: {actual_uid}",
                details={"name": name, "kind": "pods"},
            )
        # So does it the resourceVersion precondition (message as the v1.36 API server's).
        wanted_version = (binding.get("metadata") or {}).get("resourceVersion")
        actual_version = pod["metadata"].get("resourceVersion")
        if wanted_version and wanted_version != actual_version:
            return status_response(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": StorageError: invalid object, '
                f"Code: 4, Key: /registry/pods/{namespace}/{name}, ResourceVersion: 0, "
                f"AdditionalErrorMsg: Precondition failed: ResourceVersion in precondition: "
                f"{wanted_version}, ResourceVersion in object meta: {actual_version}",
                details={"name": name, "kind": "pods"},
            )
        current = pod["spec"].get("nodeName")
        if current:
            return status_response(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{current}"',
                details={"name": name, "kind": "pods/binding"},
            )
        node = binding["target"]["name"]

        def bind(obj: Obj) -> None:
            obj["spec"]["nodeName"] = node
            conditions = obj["status"].setdefault("conditions", [])
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": _now(),
                }
            )

        self._update("pods", (namespace, name), bind)
        return _json(201, status_body(201, "", "", success=True))

    async def _patch_pod(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if request.content_type != "application/merge-patch+json":
            return status_response(
                415,
                "UnsupportedMediaType",
                "the fake API server accepts only application/merge-patch+json on pods",
            )
        patch = await request.json()
        key = (namespace, name)
        if key not in self.objects["pods"]:
            return _not_found("pods", name)
        new = merge_patch(self.objects["pods"][key], patch)
        # Identity is not patchable; the real server would reject it, the fake just keeps it.
        new["metadata"] = {
            **new["metadata"],
            "name": name,
            "namespace": namespace,
            "uid": self.objects["pods"][key]["metadata"]["uid"],
        }
        return _json(200, self._typed("pods", self._replace("pods", key, new)))

    async def _resize(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not self.is_resize_supported:
            return status_response(
                404, "NotFound", "the server could not find the requested resource", details={}
            )
        if request.content_type != "application/strategic-merge-patch+json":
            return status_response(
                415, "UnsupportedMediaType", "pods/resize takes a strategic merge patch here"
            )
        key = (namespace, name)
        pod = self.objects["pods"].get(key)
        if pod is None:
            return _not_found("pods", name)
        patch = await request.json()
        new = copy.deepcopy(pod)
        by_name = {c["name"]: c for c in new["spec"]["containers"]}
        for container in (patch.get("spec") or {}).get("containers") or []:
            target = by_name.get(container.get("name"))
            if target is None:
                return status_response(
                    422,
                    "Invalid",
                    f'Pod "{name}" is invalid: spec: Forbidden: only cpu and memory resources '
                    "are mutable",
                    details={"name": name, "kind": "Pod"},
                )
            resources = target.setdefault("resources", {})
            for part in ("requests", "limits"):
                update = (container.get("resources") or {}).get(part) or {}
                resources[part] = merge_patch(resources.get(part) or {}, update)
        causes = _resize_causes(pod, new)
        if causes:
            # What kube-apiserver v1.36 answers (tests/controlplane/test_api.py checks the same
            # words against the real one).
            words = [f"{field}: {message}" for field, message in causes]
            text = words[0] if len(words) == 1 else f"[{', '.join(words)}]"
            return status_response(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: {text}',
                details={
                    "name": name,
                    "kind": "Pod",
                    "causes": [
                        {"reason": "FieldValueInvalid", "message": message, "field": field}
                        for field, message in causes
                    ],
                },
            )
        new["metadata"]["generation"] = int(new["metadata"].get("generation", 1)) + 1
        return _json(200, self._typed("pods", self._replace("pods", key, new)))

    async def _create_event(self, request: web.Request) -> web.Response:
        event = await request.json()
        meta = event.setdefault("metadata", {})
        if "name" not in meta:
            meta["name"] = meta.pop("generateName", "event.") + uuid.uuid4().hex[:5]
        meta["namespace"] = request.match_info["namespace"]
        meta |= {
            "uid": str(uuid.uuid4()),
            "resourceVersion": self._next_rv(),
            "creationTimestamp": _now(),
        }
        self.events.append(event)
        return _json(201, event)

    async def _review_token(self, request: web.Request) -> web.Response:
        review = await request.json()
        spec = review.get("spec") or {}
        token, wanted = spec.get("token", ""), list(spec.get("audiences") or [])
        identity = self.tokens.get(token)
        status: Obj
        if identity is None:
            status = {"user": {}, "error": "[invalid bearer token, Token has been invalidated]"}
        elif wanted and not set(wanted) & set(identity.audiences):
            status = {
                "user": {},
                "error": f"[invalid bearer token, token audiences {_go_quote(identity.audiences)}"
                f" is invalid for the target audiences {_go_quote(wanted)}]",
            }
        else:
            extra = {"authentication.kubernetes.io/credential-id": [f"JTI={uuid.uuid4()}"]}
            for key, value in (
                ("node-name", identity.node_name),
                ("node-uid", identity.node_uid),
                ("pod-name", identity.pod_name),
                ("pod-uid", identity.pod_uid),
            ):
                if value is not None:
                    extra[f"authentication.kubernetes.io/{key}"] = [value]
            status = {
                "authenticated": True,
                "user": {
                    "username": identity.username,
                    "uid": identity.uid,
                    "groups": list(identity.groups),
                    "extra": extra,
                },
                "audiences": [a for a in wanted if a in identity.audiences]
                or list(identity.audiences),
            }
        return _json(
            201,
            {
                "kind": "TokenReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {},
                # A real API server leaves out an empty list (the API server's own audiences).
                "spec": {"token": token, **({"audiences": wanted} if wanted else {})},
                "status": status,
            },
        )


def kubeconfig_for(url: str, *, user: str = "fake") -> dict[str, Any]:
    """A kubeconfig (as a dict: write it as JSON, which is YAML) for the fake API at ``url``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": user, "user": {"token": user}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": user}}],
        "current-context": "fake",
    }


def fake_jwt(
    name: str, *, audiences: Iterable[str] = ("vm-autoscaling-extender",), exp: int | None = None
) -> str:
    """A token shaped like a ServiceAccount JWT (claims as in token-claims.json, a signature
    nobody checks): what the extender reads before it asks for a review. ``name`` is its
    ``jti``, so each name is another token."""

    def part(value: Obj) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    claims = {
        "aud": list(audiences),
        "exp": exp if exp is not None else 4_102_444_800,  # 2100-01-01
        "iss": "https://kubernetes.default.svc.cluster.local",
        "jti": name,
        "sub": "system:serviceaccount:unknown:unknown",
    }
    return f"{part({'alg': 'RS256', 'kid': 'fake'})}.{part(claims)}.c2lnbmF0dXJl"


def _go_quote(values: Iterable[str]) -> str:
    # Go's %q of a []string: ["a" "b"].
    return "[" + " ".join(json.dumps(v) for v in values) + "]"


def _json(status: int, body: Obj) -> web.Response:
    return web.Response(status=status, body=dumps(body), content_type="application/json")


def _stream_response() -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.enable_chunked_encoding()
    return response


def _not_found(resource: str, name: str) -> web.Response:
    return status_response(
        404, "NotFound", f'{resource} "{name}" not found', details={"name": name, "kind": resource}
    )
