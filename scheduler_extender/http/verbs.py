"""kube-scheduler's extender verbs: filter, prioritize, bind, preempt.

Shell, thin: decode the body, call the pure core (``placement``) or ``Extender.bind``, encode.
Only HTTP 200 carries an answer kube-scheduler should read: a node that does not fit is data
(``FailedNodes``), a failed bind is an ``Error`` string. Other statuses are for malformed
requests (400), oversized bodies (413) and the time before the first lists are in (503).

Which field carries the nodes: the answer to filter uses the field the request used
(``NodeNames`` in cache mode, ``Nodes`` with the request's own Node objects otherwise);
answering in the other field would make kube-scheduler drop every node.
"""

from __future__ import annotations

import asyncio

import msgspec
import structlog
from aiohttp import web

from protocol.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
)
from protocol.kube import Pod
from scheduler_extender.errors import ProtocolError
from scheduler_extender.http.keys import EXTENDER
from scheduler_extender.http.middleware import decode, json_response, read_body
from scheduler_extender.placement import choose_victims, reject_all, score_nodes
from scheduler_extender.podinfo import PodError, PodInfo, pod_info
from scheduler_extender.service import Extender


class _RawNodeList(msgspec.Struct, kw_only=True):
    """Nodes kept as the bytes kube-scheduler sent, to echo them back untouched."""

    metadata: msgspec.Raw = msgspec.Raw(b"{}")
    items: list[msgspec.Raw] = []


class _RawNodesArgs(msgspec.Struct, rename="pascal", kw_only=True):
    nodes: _RawNodeList | None = None


class _FilterAnswer(msgspec.Struct, rename="pascal", kw_only=True):
    """``ExtenderFilterResult`` with ``Nodes`` as raw bytes (non-cache mode echo)."""

    nodes: _RawNodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str]
    failed_and_unresolvable_nodes: dict[str, str]
    error: str = ""


def _pod(extender: Extender, pod: Pod) -> PodInfo:
    try:
        info = pod_info(pod, scheduler_name=extender.config.scheduler_name)
    except PodError as e:
        raise ProtocolError(str(e)) from e
    structlog.contextvars.bind_contextvars(pod=info.key)
    return info


def _names(args: ExtenderArgs) -> list[str]:
    if args.node_names is not None:
        return args.node_names
    if args.nodes is not None:
        return [n.metadata.name for n in args.nodes.items]
    raise ProtocolError("ExtenderArgs: neither NodeNames nor Nodes is set")


async def filter_nodes(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    extender.require_synced()
    body = await read_body(request)
    args = decode(ExtenderArgs, body)
    info = _pod(extender, args.pod)
    names = _names(args)
    if info.vm_error is not None:
        result = reject_all(names, f"VM pod {info.key} is invalid: {info.vm_error}")
    else:
        result = extender.index.filter(info.initial_demand(), names)
        if info.is_ours:
            extender.capacity_waits.filter_answered(
                info.uid, info.key, has_room=bool(result.passed), now=_loop_time()
            )
    structlog.contextvars.bind_contextvars(
        reason=f"{len(result.passed)} of {len(names)} nodes fit"
        + (f" ({info.vm_error})" if info.vm_error else "")
    )
    answer = _FilterAnswer(
        failed_nodes=result.failed, failed_and_unresolvable_nodes=result.unresolvable
    )
    if args.node_names is not None:
        answer.node_names = result.passed
    else:
        raw = decode(_RawNodesArgs, body).nodes or _RawNodeList()
        passed = set(result.passed)
        assert args.nodes is not None
        answer.nodes = _RawNodeList(
            metadata=raw.metadata,
            items=[
                item
                for item, node in zip(raw.items, args.nodes.items, strict=True)
                if node.metadata.name in passed
            ],
        )
    return json_response(answer)


async def prioritize(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    extender.require_synced()
    args = decode(ExtenderArgs, await read_body(request))
    info = _pod(extender, args.pod)
    names = _names(args)
    if info.vm_error is not None:
        scores = [(name, 0) for name in names]
    else:
        size = info.initial_demand()
        growth = max(0, info.vm.top_vcpus * 1000 - size.cpu_millis) if info.vm else 0
        scores = score_nodes(
            extender.ledger,
            names,
            size,
            growth_millis=growth,
            strategy=extender.config.scoring.strategy,
        )
    structlog.contextvars.bind_contextvars(reason=f"scored {len(scores)} nodes")
    return json_response([HostPriority(host=name, score=score) for name, score in scores])


async def bind(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    extender.require_synced()
    args = decode(ExtenderBindingArgs, await read_body(request))
    structlog.contextvars.bind_contextvars(
        pod=f"{args.pod_namespace}/{args.pod_name}", node=args.node
    )
    error = await extender.bind(
        namespace=args.pod_namespace, name=args.pod_name, uid=args.pod_uid, node=args.node
    )
    structlog.contextvars.bind_contextvars(reason=error or "bound")
    return json_response(ExtenderBindingResult(error=error))


async def preempt(request: web.Request) -> web.Response:
    extender = request.app[EXTENDER]
    extender.require_synced()
    args = decode(ExtenderPreemptionArgs, await read_body(request))
    info = _pod(extender, args.pod)
    proposed: dict[str, tuple[list[str], int]] = {}
    if args.node_name_to_meta_victims is not None:
        for node, meta in args.node_name_to_meta_victims.items():
            proposed[node] = ([p.uid for p in meta.pods or ()], meta.num_pdb_violations)
    elif args.node_name_to_victims is not None:
        for node, victims in args.node_name_to_victims.items():
            uids = [p.metadata.uid for p in victims.pods or ()]
            proposed[node] = (uids, victims.num_pdb_violations)
    size = info.initial_demand()
    answer: dict[str, MetaVictims] = {}
    dropped = 0
    for node, (uids, pdb) in proposed.items():
        choice = choose_victims(extender.ledger, node, size, uids, pdb)
        if choice.victims is None:
            dropped += 1
            continue
        answer[node] = MetaVictims(
            pods=[MetaPod(uid=uid) for uid in choice.victims],
            num_pdb_violations=choice.num_pdb_violations,
        )
    structlog.contextvars.bind_contextvars(
        reason=f"{len(answer)} of {len(proposed)} nodes kept, {dropped} dropped"
    )
    return json_response(ExtenderPreemptionResult(node_name_to_meta_victims=answer))


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
