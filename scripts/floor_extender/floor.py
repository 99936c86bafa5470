"""The floor of the extender protocol on this project's own stack, for bench_scheduling.py.

``main.go`` beside this file is the protocol's floor: a do-nothing extender in Go. This is the
same do-nothing extender in Python, on the libraries the extender is built on (aiohttp on
uvloop, msgspec, prometheus-client), so that the bench can split ours/floor into what the
stack costs (this over the Go floor) and what the extender's own work costs (ours over this).
Filter passes every node, prioritize scores every node 0, bind POSTs the pod's Binding with its
UID as a precondition, preempt agrees with kube-scheduler's victims; no ledger, no per-request
log line. With ``-watch-pods`` it also watches every pod and keeps each one's node and
requests, the least an extender that counts pods reads (the bench runs it so). Benchmark
tooling, not part of any deployment.

    python floor.py -kubeconfig PATH -listen 127.0.0.1:PORT [-buckets 0.001,...] [-watch-pods]

The other flags are ``main.go``'s, so that the bench starts either the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest

JSON = "application/json"


class _Name(msgspec.Struct, frozen=True):
    name: str = ""


class _Meta(msgspec.Struct, frozen=True):
    metadata: _Name = _Name()


class _Nodes(msgspec.Struct):
    items: list[_Meta] = []


_NULL = msgspec.Raw(b"null")


class _Args(msgspec.Struct, rename="pascal"):
    nodes: msgspec.Raw = _NULL  # echoed as sent: every node passes
    node_names: list[str] | None = None


class _BindArgs(msgspec.Struct, rename="pascal"):
    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(name="PodUID")
    node: str


class _Victim(msgspec.Struct):
    metadata: dict[str, Any] = {}


class _Victims(msgspec.Struct, rename="pascal"):
    pods: list[_Victim] | None = None
    num_pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class _PreemptArgs(msgspec.Struct, rename="pascal"):
    node_name_to_victims: dict[str, _Victims] | None = None
    node_name_to_meta_victims: dict[str, Any] | None = None


class _Requests(msgspec.Struct, frozen=True):
    requests: dict[str, str] = {}


class _Container(msgspec.Struct, frozen=True):
    resources: _Requests = _Requests()


class _PodSpec(msgspec.Struct, frozen=True, rename="camel"):
    node_name: str = ""
    containers: list[_Container] = []


class _PodMeta(msgspec.Struct, frozen=True):
    uid: str = ""


class _Pod(msgspec.Struct, frozen=True):
    metadata: _PodMeta = _PodMeta()
    spec: _PodSpec = _PodSpec()


class _WatchEvent(msgspec.Struct, frozen=True):
    type: str
    object: _Pod


def _kubeconfig(path: str) -> tuple[str, ssl.SSLContext, str]:
    """Server, TLS context and token of the kubeconfig's first cluster and user."""
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    cluster = config["clusters"][0]["cluster"]
    token = config["users"][0]["user"]["token"]
    context = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context.load_verify_locations(cadata=pem)
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=cluster["certificate-authority"])
    return cluster["server"], context, token


def make_app(kubeconfig: str, buckets: list[float], *, watch_pods: bool) -> web.Application:
    server, context, token = _kubeconfig(kubeconfig)
    registry = CollectorRegistry()
    durations = Histogram(
        "vmautoscale_extender_verb_duration_seconds",
        "Handler time per verb.",
        ["verb"],
        buckets=buckets,
        registry=registry,
    )
    encode = msgspec.json.encode
    args_decoder = msgspec.json.Decoder(_Args)
    nodes_decoder = msgspec.json.Decoder(_Nodes)
    bind_decoder = msgspec.json.Decoder(_BindArgs)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": JSON}
    session: list[aiohttp.ClientSession] = []

    def names(args: _Args) -> list[str]:
        if args.node_names is not None:
            return args.node_names
        if args.nodes == _NULL:
            return []
        return [item.metadata.name for item in nodes_decoder.decode(args.nodes).items]

    async def filter_(request: web.Request) -> web.Response:
        with durations.labels("filter").time():
            args = args_decoder.decode(await request.read())
            answer: dict[str, Any] = {"FailedNodes": {}, "Error": ""}
            if args.node_names is not None:
                answer["NodeNames"] = args.node_names
            else:
                answer["Nodes"] = args.nodes
            return web.Response(body=encode(answer), content_type=JSON)

    async def prioritize(request: web.Request) -> web.Response:
        with durations.labels("prioritize").time():
            args = args_decoder.decode(await request.read())
            body = encode([{"Host": name, "Score": 0} for name in names(args)])
            return web.Response(body=body, content_type=JSON)

    async def bind(request: web.Request) -> web.Response:
        with durations.labels("bind").time():
            args = bind_decoder.decode(await request.read())
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": args.pod_name,
                    "namespace": args.pod_namespace,
                    "uid": args.pod_uid,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
            }
            url = f"{server}/api/v1/namespaces/{args.pod_namespace}/pods/{args.pod_name}/binding"
            message = ""
            try:
                async with session[0].post(url, data=encode(binding), headers=headers) as r:
                    body = await r.read()
                    if r.status != 201:
                        message = f"binding: {r.status} {body.decode(errors='replace')}"
            except aiohttp.ClientError as e:
                message = str(e)
            return web.Response(body=encode({"Error": message}), content_type=JSON)

    async def preempt(request: web.Request) -> web.Response:
        with durations.labels("preempt").time():
            args = msgspec.json.decode(await request.read(), type=_PreemptArgs)
            victims = args.node_name_to_meta_victims
            if victims is None:
                victims = {
                    node: {
                        "Pods": [{"UID": p.metadata.get("uid", "")} for p in v.pods or ()],
                        "NumPDBViolations": v.num_pdb_violations,
                    }
                    for node, v in (args.node_name_to_victims or {}).items()
                }
            return web.Response(body=encode({"NodeNameToMetaVictims": victims}), content_type=JSON)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def watch() -> None:
        """Every pod's node and requests, from one watch of all pods (no list, no resume):
        the least an extender that counts pods reads, for ``-watch-pods``."""
        decoder = msgspec.json.Decoder(_WatchEvent)
        placed: dict[str, tuple[str, list[_Container]]] = {}
        url = f"{server}/api/v1/pods"
        query = {"watch": "1", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None)
        async with session[0].get(url, params=query, headers=headers, timeout=timeout) as r:
            async for line in r.content:
                event = decoder.decode(line)
                if event.type == "DELETED":
                    placed.pop(event.object.metadata.uid, None)
                elif event.object.spec.node_name:
                    pod = event.object
                    placed[pod.metadata.uid] = (pod.spec.node_name, pod.spec.containers)

    async def client(app: web.Application) -> Any:
        connector = aiohttp.TCPConnector(ssl=context, limit=0)
        session.append(aiohttp.ClientSession(connector=connector))
        watching = asyncio.create_task(watch()) if watch_pods else None
        yield
        if watching is not None:
            watching.cancel()
        await session[0].close()

    app = web.Application()
    app.cleanup_ctx.append(client)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_post("/preempt", preempt)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-kubeconfig", required=True, help="kubeconfig with a server and token")
    parser.add_argument("-listen", default="127.0.0.1:10298", help="HOST:PORT for the verbs")
    parser.add_argument(
        "-buckets",
        default="0.0001,0.00025,0.0005,0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,1,5",
        help="upper bounds of the handler-time histogram's buckets, seconds, ascending",
    )
    parser.add_argument(
        "-watch-pods",
        action="store_true",
        help="also watch every pod (their nodes and requests), as a counting extender must",
    )
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    try:
        buckets = [float(b) for b in args.buckets.split(",")]
        app = make_app(args.kubeconfig, buckets, watch_pods=args.watch_pods)
    except (OSError, ValueError, KeyError, yaml.YAMLError) as e:
        print(f"floor.py: {e}", file=sys.stderr)
        return 2
    loop = uvloop.new_event_loop()
    web.run_app(app, host=host, port=int(port), access_log=None, print=None, loop=loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
