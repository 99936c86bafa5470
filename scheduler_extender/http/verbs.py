"""kube-scheduler's extender verbs: filter, prioritize, bind, preempt.

Shell, thin: decode the body, call the pure core (``placement``) or ``Extender.bind``, encode.
Only HTTP 200 carries an answer kube-scheduler should read: a node that does not fit is data
(``FailedNodes``), a failed bind is an ``Error`` string. Other statuses are for malformed
requests (400), oversized bodies (413) and the time before the first lists are in (503).

Which field carries the nodes: the answer to filter uses the field the request used
(``NodeNames`` in cache mode, ``Nodes`` with the request's own Node objects otherwise);
answering in the other field would make kube-scheduler drop every node.

Admission comes first in filter, before the answer cache: the cached answers say which nodes
fit a *size*, and say nothing about whether *this pod* may be placed yet. A pod waiting for its
namespace's quota gets every node in ``FailedNodes`` (resolvable: it will fit once admitted)
with the queue's reason, never a cached "these nodes fit".
"""

from __future__ import annotations

import asyncio
import zlib
from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, NamedTuple

import msgspec
import structlog
from aiohttp import web

from protocol import codec
from protocol.extender import (
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
)
from protocol.kube import Pod
from scheduler_extender.core import verbs
from scheduler_extender.core.podinfo import PodError, PodInfo, pod_info
from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.answers import JSON
from scheduler_extender.http.keys import EXTENDER
from scheduler_extender.http.middleware import decode, json_response, read_body


class _RawNodeList(msgspec.Struct, kw_only=True):
    """Nodes kept as the bytes kube-scheduler sent, to echo them back untouched."""

    metadata: msgspec.Raw = msgspec.Raw(b"{}")
    items: list[msgspec.Raw] = []


class _NodeName(msgspec.Struct, frozen=True):
    name: str = ""


class _NamedNode(msgspec.Struct):
    metadata: _NodeName = _NodeName()


class _NamedNodeList(msgspec.Struct):
    items: list[_NamedNode] = []


_NULL: Final = msgspec.Raw(b"null")


class FilterArgs(msgspec.Struct, rename="pascal", kw_only=True):
    """What filter decodes up front: the Pod, and the node list as raw bytes.

    Speed: a non-cache body carries every Node object (about 1 KiB each, 6 MB for 5,000
    nodes); decoding them into ``protocol.kube.Node`` structs was the bulk of the handler's
    work and made a full GC pass likely. Only their names are needed, and only when the
    answer is not cached (see ``Answers``); the raw bytes are the cache key and, split
    per item, the echo.
    """

    pod: Pod
    nodes: msgspec.Raw = _NULL
    node_names: msgspec.Raw = _NULL


class _FilterAnswer(msgspec.Struct, rename="pascal", kw_only=True):
    """``ExtenderFilterResult`` with ``Nodes`` as raw bytes (non-cache mode echo)."""

    nodes: _RawNodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str]
    failed_and_unresolvable_nodes: dict[str, str]
    error: str = ""


class _Cached(NamedTuple):
    version: tuple[int, int]
    listed: msgspec.Raw  # the node list this answers, compared in full before any reuse
    body: bytes
    reason: str
    has_room: bool  # some node passed: the recommender's capacity-wait tracking needs it


# (what the answer is for: filter's pod size, prioritize's (size, growth, strategy); is cache
# mode; the node list's length)
_Key = tuple[Hashable, bool, int]
# A node list's fingerprint is the CRC of the whole list up to this size; of a longer one it
# hashes this many evenly spaced slices of this many bytes (see ``fingerprint``).
_WHOLE_BYTES: Final = 16 * 1024
_SLICES: Final = 16
_SLICE_BYTES: Final = 256


def fingerprint(listed: msgspec.Raw) -> int:
    """A cheap hash of a node list: the CRC-32 of all of it when it is short (a cache-mode list
    of names, the window kube-scheduler sends), else its length and ``_SLICES`` slices of it.

    Hashing all of a non-cache list (every Node object, megabytes at 5,000 nodes) took longer
    than answering; the slices cost the same whatever the size, and for a short list more
    than a CRC of all of it, read in place with no copy (docs/DEPLOY.md has the figures). Two
    lists with the same fingerprint are told apart by comparing them in full (``memcmp``), so
    a collision costs a miss, never a wrong answer.
    """
    view = memoryview(listed)
    size = len(view)
    if size <= _WHOLE_BYTES:
        return zlib.crc32(view)
    step = (size - _SLICE_BYTES) // (_SLICES - 1)
    parts = [bytes(view[i : i + _SLICE_BYTES]) for i in range(0, size - _SLICE_BYTES + 1, step)]
    return hash((size, *parts))


class Answers:
    """Encoded answers of one verb by (what they are for, mode, node list), each valid while
    the core index's version it was made at stands still: filter's by pod size (the
    FitIndex's ``version(size)``), prioritize's by (size, growth, strategy) (the ScoreIndex's
    ``version``).

    Speed: kube-scheduler asks about the same few VM shapes with the same node list again and
    again, and most ledger changes (permits, binds elsewhere) do not change which nodes reject
    a size, nor (scores being whole numbers from 0 to 10) any node's score. A hit skips
    decoding the names, the per-node loop and the encoding (several milliseconds for 5,000
    nodes); it costs a fingerprint of the list and one ``memcmp`` of it against the list the
    answer was for, and copies nothing. One answer per fingerprint: a
    list that replaced another (a node's resourceVersion moved) takes its slot. Bounded by
    bytes, lists included: a non-cache list is every Node object.
    """

    def __init__(self, *, max_bytes: int = 64 * 2**20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[_Key, int], _Cached] = OrderedDict()

    def get(self, key: _Key, listed: msgspec.Raw, version: tuple[int, int]) -> _Cached | None:
        slot = (key, fingerprint(listed))
        found = self._entries.get(slot)
        if found is None or found.version != version or found.listed != listed:
            return None
        self._entries.move_to_end(slot)
        return found

    def put(self, key: _Key, entry: _Cached) -> None:
        size = len(entry.listed) + len(entry.body)
        if size > self._max_bytes:
            return
        slot = (key, fingerprint(entry.listed))
        old = self._entries.pop(slot, None)
        if old is not None:
            self._bytes -= len(old.listed) + len(old.body)
        self._entries[slot] = entry
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted.listed) + len(evicted.body)


FILTER_ANSWERS = web.AppKey("filter_answers", Answers)
PRIORITIZE_ANSWERS = web.AppKey("prioritize_answers", Answers)


class PodInfos:
    """``pod_info`` by (uid, resourceVersion), the most recent ``max_entries``.

    kube-scheduler sends the same version of a pod to filter, prioritize and preempt, and
    again on every retry while it is pending; the API server never gives two contents one
    version, so the answer is the same. A pod without a uid or a resourceVersion (never one
    from the API server) is never kept, and an invalid pod is refused every time.
    """

    def __init__(self, scheduler_name: str, *, max_entries: int = 4096) -> None:
        self._scheduler_name = scheduler_name
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], PodInfo] = OrderedDict()
        # uid -> the newest version filter saw: what bind falls back on for a pod the
        # extender's own watch has not delivered yet (kube-scheduler binds within milliseconds
        # of a pod's creation; the watch may lag).
        self._latest: OrderedDict[str, PodInfo] = OrderedDict()

    def latest(self, uid: str) -> PodInfo | None:
        return self._latest.get(uid)

    def get(self, pod: Pod) -> PodInfo:
        meta = pod.metadata
        key = (meta.uid, meta.resource_version)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        try:
            info = pod_info(pod, scheduler_name=self._scheduler_name)
        except PodError as e:
            raise ProtocolError(str(e)) from e
        if meta.uid and meta.resource_version:
            self._entries[key] = info
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
            self._latest[meta.uid] = info
            self._latest.move_to_end(meta.uid)
            if len(self._latest) > self._max_entries:
                self._latest.popitem(last=False)
        return info


POD_INFOS = web.AppKey("pod_infos", PodInfos)


def _pod(app: web.Application, pod: Pod) -> PodInfo:
    info = app[POD_INFOS].get(pod)
    structlog.contextvars.bind_contextvars(pod=info.key)
    return info


def _listed(args: FilterArgs) -> tuple[bool, msgspec.Raw]:
    """(is cache mode, the raw node list): the field the request used, as the answer must.

    Not copied: it is a view of the request body, and the answer cache compares it in place.
    """
    if args.node_names != _NULL:
        return True, args.node_names
    if args.nodes != _NULL:
        return False, args.nodes
    raise ProtocolError("ExtenderArgs: neither NodeNames nor Nodes is set")


def _listed_names(is_cache: bool, listed: msgspec.Raw) -> list[str]:
    if is_cache:
        return decode(list[str], listed)
    return [n.metadata.name for n in decode(_NamedNodeList, listed).items]


def _encode(
    result: verbs.FilterResult, *, is_cache: bool, listed: msgspec.Raw, names: list[str]
) -> bytes:
    """Filter's answer in the field the request used; the passing Node objects echoed as sent."""
    answer = _FilterAnswer(
        failed_nodes=result.failed, failed_and_unresolvable_nodes=result.unresolvable
    )
    if is_cache:
        answer.node_names = result.passed
    else:
        raw = decode(_RawNodeList, listed)
        passed = set(result.passed)
        answer.nodes = _RawNodeList(
            metadata=raw.metadata,
            items=[item for item, name in zip(raw.items, names, strict=True) if name in passed],
        )
    return codec.encode(answer)


async def filter_nodes(request: web.Request) -> web.Response:
    """``verbs.filter_pod`` decides; this caches its encoded answers (``Answers``) for
    admitted valid pods, and parks the pods no node has room for."""
    app = request.app
    extender = app[EXTENDER]
    extender.require_synced()  # before the body is read: a 503 costs no body
    args = decode(FilterArgs, await read_body(request))
    info = _pod(app, args.pod)
    is_cache, listed = _listed(args)
    admission = extender.admit(info) if info.vm_error is None else None
    found = key = version = None
    if admission is not None and admission.is_admitted:
        size = info.initial_demand()
        version = extender.index.version(size)
        key = (size, is_cache, len(listed))
        found = app[FILTER_ANSWERS].get(key, listed, version)
        extender.metrics.answer_children["filter", found is not None].inc()
    if found is not None:
        encoded, reason, has_room = found.body, found.reason, found.has_room
    else:
        names = _listed_names(is_cache, listed)
        filtered = verbs.filter_pod(extender.index, info, names, admission)
        encoded = _encode(filtered.result, is_cache=is_cache, listed=listed, names=names)
        reason, has_room = filtered.reason, filtered.has_room
        if key is not None and version is not None:
            # A copy: the request's view would keep its whole body (the Pod too) alive.
            kept = msgspec.Raw(bytes(listed))
            app[FILTER_ANSWERS].put(key, _Cached(version, kept, encoded, reason, has_room))
    if info.is_ours:
        # Also on a cache hit: how long a pod has found no room is what auto-publish acts on.
        extender.capacity_waits.filter_answered(
            info.uid, info.key, has_room=has_room, now=_loop_time()
        )
        if has_room:
            extender.parked.unpark(info.uid)
        elif info.vm_error is None:
            # Rejected everywhere for room: kube-scheduler parks it; nudge it once room shows.
            extender.parked.park(
                uid=info.uid,
                namespace=info.namespace,
                name=info.name,
                demand=info.initial_demand(),
                nodes=_listed_names(is_cache, listed),
            )
    structlog.contextvars.bind_contextvars(reason=reason)
    return web.Response(body=encoded, content_type=JSON)


async def prioritize(request: web.Request) -> web.Response:
    """``verbs.prioritize`` decides; this caches its encoded answers (``Answers``) for valid
    pods, by (size, growth, strategy) and node list, while the ScoreIndex's version stands."""
    app = request.app
    extender = app[EXTENDER]
    extender.require_synced()
    # The same lean decode as filter: in non-cache mode the body carries every passing Node
    # object, and turning them all into structs cost more than the scoring (only names count).
    args = decode(FilterArgs, await read_body(request))
    info = _pod(app, args.pod)
    is_cache, listed = _listed(args)
    strategy = extender.config.scoring.strategy
    key = version = None
    if info.vm_error is None:
        size, growth = info.initial_demand(), verbs.growth_millis(info)
        version = (0, extender.scores.version(size, growth_millis=growth, strategy=strategy))
        key = ((size, growth, strategy), is_cache, len(listed))
        found = app[PRIORITIZE_ANSWERS].get(key, listed, version)
        extender.metrics.answer_children["prioritize", found is not None].inc()
        if found is not None:
            structlog.contextvars.bind_contextvars(reason=found.reason)
            return web.Response(body=found.body, content_type=JSON)
    names = _listed_names(is_cache, listed)
    scores = verbs.prioritize(extender.scores, info, names, strategy)
    reason = f"scored {len(scores)} nodes"
    body = codec.encode([HostPriority(host=name, score=score) for name, score in scores])
    if key is not None and version is not None:
        kept = msgspec.Raw(bytes(listed))  # a copy, as filter's (see there)
        app[PRIORITIZE_ANSWERS].put(key, _Cached(version, kept, body, reason, has_room=True))
    structlog.contextvars.bind_contextvars(reason=reason)
    return web.Response(body=body, content_type=JSON)


async def bind(request: web.Request) -> web.Response:
    app = request.app
    extender = app[EXTENDER]
    extender.require_synced()
    args = decode(ExtenderBindingArgs, await read_body(request))
    structlog.contextvars.bind_contextvars(
        pod=f"{args.pod_namespace}/{args.pod_name}", node=args.node
    )
    error = await extender.bind(
        namespace=args.pod_namespace,
        name=args.pod_name,
        uid=args.pod_uid,
        node=args.node,
        filtered=app[POD_INFOS].latest(args.pod_uid),
    )
    structlog.contextvars.bind_contextvars(reason=error or "bound")
    return web.Response(body=codec.encode(ExtenderBindingResult(error=error)), content_type=JSON)


async def preempt(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    extender.require_synced()
    args = decode(ExtenderPreemptionArgs, await read_body(request))
    info = _pod(request.app, args.pod)
    proposed: dict[str, tuple[list[str], int]] = {}
    if args.node_name_to_meta_victims is not None:
        for node, meta in args.node_name_to_meta_victims.items():
            proposed[node] = ([p.uid for p in meta.pods or ()], meta.num_pdb_violations)
    elif args.node_name_to_victims is not None:
        for node, victims in args.node_name_to_victims.items():
            uids = [p.metadata.uid for p in victims.pods or ()]
            proposed[node] = (uids, victims.num_pdb_violations)
    kept = verbs.preempt(extender.ledger, info, proposed)
    answer = {
        node: MetaVictims(
            pods=[MetaPod(uid=uid) for uid in choice.victims or ()],
            num_pdb_violations=choice.num_pdb_violations,
        )
        for node, choice in kept.items()
    }
    dropped = len(proposed) - len(answer)
    structlog.contextvars.bind_contextvars(
        reason=f"{len(answer)} of {len(proposed)} nodes kept, {dropped} dropped"
    )
    return json_response(ExtenderPreemptionResult(node_name_to_meta_victims=answer))


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
