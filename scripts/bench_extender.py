"""Benchmark the scheduler extender over real HTTP against a bare aiohttp endpoint.

Three processes, so that the extender has a core of its own:

* ``--role fake-api``: ``testkit.kube_api.FakeKubeApi`` holding the generated cluster
  (nodes, pods, one agent token per permit node). It answers the extender's lists and watches,
  the Bindings of ``/bind`` and the TokenReviews of the permit port.
* ``--role server``: the extender exactly as ``__main__`` builds it (``make_app`` and, with
  ``--permit-front process`` (the default), the permit port in a child process, the permit front,
  as ``serve`` runs it, or with ``inline`` ``make_permits_app`` on the server's own loop;
  structlog configured at ``--log-level`` as JSON into a log file), plus a
  *bare* aiohttp app in the same process and loop. The bare app decodes the same body with the
  same msgspec types as the extender's handler and answers a constant empty body: it is the
  floor that aiohttp + decoding set, so ``extender p99 / bare p99`` is what the extender adds.
  Pinned to one CPU (the last of this process's affinity, ``testkit.bench.split_cpus``) when
  there are at least two; the fake API server and the load generator get the others.
* the orchestrator (no ``--role``): generates the cluster deterministically (seeded), starts the
  other two, waits for ``/readyz``, runs the phases as the load generator, prints one JSON
  object.

Phases (sequential calls, latency measured by the client, alternating extender and bare in
blocks so that drift hits both alike):

* filter, cache mode (``NodeNames``) and non-cache mode (full Node objects in ``Nodes``, shaped
  like shared/reference/kube/extender/nocache; the answer echoes them). A third target, the
  bare endpoint answering with the extender's own answer for that pod, separates what the
  answer's size costs (tens of KB of node names and reasons, or megabytes of echoed Nodes,
  against the bare endpoint's empty answer) from what the extender's logic adds;
* bind of pending VM pods (the Binding goes to the fake API server, whose watch then shows the
  pod bound);
* permits: batches of ``--batch`` VMs per node with token-review auth (the first batch of each
  token is reviewed by the fake API, the rest hit the identity cache), several agents at once,
  for ``--permit-seconds``; VM permits per second, and per second of the server's CPU time
  (its permit front's included; ``main_process_cpu_seconds`` is the main process's alone).

Durable permit writes and NODE_ALLOC Events are off: they run off the request path and would
only add background load to the server's core.

    .venv/bin/python scripts/bench_extender.py [--nodes 5000] [--pods 50000] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec
from aiohttp import web

from testkit import bench as kit
from testkit.ports import free_port
from testkit.procfs import children_cpu_seconds, cpu_seconds

Obj = dict[str, Any]
SCHEDULER: Final = "vm-scheduler"
AUDIENCE: Final = "vm-autoscaling-extender"
VM_LABELS: Final = {"vm-autoscaling.io/vm": "true"}
GIB: Final = 2**30
PENDING_NAMESPACE: Final = "pending"
# Every FULL_EVERY-th ordinary node is filled to within 500m of its usable CPU, so filter has
# real rejections (resolvable: preemption could help).
FULL_EVERY: Final = 10
# Every SMALL_EVERY-th ordinary node is too small ever to hold the 4-vCPU filter pod
# (unresolvable rejections).
SMALL_EVERY: Final = 25


# --- the cluster -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Cluster:
    nodes: list[Obj]
    pods: list[Obj]
    pending: list[Obj]  # our VM pods without a node: filter bodies and bind targets
    bind_nodes: list[str]  # nodes with room, for binds
    permit_nodes: dict[str, list[Obj]]  # node -> its VM pods (one batch each)

    @property
    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]


def token_name(node: str) -> str:
    return f"agent-token-{node}"


def token_for(node: str) -> str:
    from testkit.kube_api import fake_jwt

    return fake_jwt(token_name(node), audiences=(AUDIENCE,))


def node_object(name: str, *, index: int, cpu: int) -> Obj:
    """A Node shaped like the recorded non-cache filter samples (managedFields and all)."""
    resources = {"cpu": str(cpu), "ephemeral-storage": "50Gi", "memory": f"{cpu * 4}Gi"}
    resources["pods"] = "110"
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "type": "bench",
    }
    return {
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{index:012d}",
            "resourceVersion": str(100 + index),
            "creationTimestamp": "2026-11-21T11:32:12Z",
            "labels": labels,
            "managedFields": [
                {
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-21T11:32:12Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, **{f"f:{k}": {} for k in labels}}}
                    },
                }
            ],
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": "FakeReady",
                    "message": "created by hand",
                }
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                k: ""
                for k in (
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
    }


def generate(*, nodes: int, pods: int, batch: int, binds: int, seed: int) -> Cluster:
    """The same cluster for the same arguments (a seeded ``random.Random``)."""
    from testkit.kube_api import pod_object

    rng = random.Random(seed)
    n_permit = max(1, min(20, nodes // 250))
    n_pending = max(8, min(binds, pods // 10))
    if nodes < n_permit + 2 or pods < n_permit * batch + n_pending:
        raise kit.BenchError("too few nodes or pods for the permit batches and pending pods")
    uid = iter(range(10**9))

    def vm(name: str, *, namespace: str, node: str | None, vcpus: int, growth: int = 6) -> Obj:
        return pod_object(
            name,
            namespace=namespace,
            uid=f"10000000-0000-4000-8000-{next(uid):012d}",
            node_name=node,
            labels=VM_LABELS,
            annotations={
                "vm-autoscaling.io/min-vcpus": str(vcpus),
                "vm-autoscaling.io/max-vcpus": str(vcpus + growth),
            },
            cpu=str(vcpus),
            memory="1Gi",
            scheduler_name=SCHEDULER,
            phase="Running" if node else "Pending",
        )

    def foreign(name: str, *, node: str, cpu: str) -> Obj:
        return pod_object(
            name,
            namespace="apps",
            uid=f"20000000-0000-4000-8000-{next(uid):012d}",
            node_name=node,
            labels={"app": name.rsplit("-", 1)[0]},
            container="app",
            cpu=cpu,
            memory="512Mi",
            scheduler_name="default-scheduler",
            phase="Running",
        )

    node_objs: list[Obj] = []
    all_pods: list[Obj] = []
    permit_nodes: dict[str, list[Obj]] = {}
    ordinary: list[str] = []
    full: list[tuple[str, int]] = []
    for i in range(nodes):
        name = f"node-{i:05d}"
        if i < n_permit:
            cpu = 128  # room for every VM of a batch to double
        elif i % SMALL_EVERY == 0:
            cpu = 4
        else:
            cpu = 32 if i % 2 else 64
        node_objs.append(node_object(name, index=i, cpu=cpu))
        if i < n_permit:
            vms = [
                vm(f"vm-{name}-{k:02d}", namespace="vms", node=name, vcpus=1) for k in range(batch)
            ]
            permit_nodes[name] = vms
            all_pods.extend(vms)
        elif cpu == 4:
            pass  # small nodes stay empty; they only ever reject the 4-vCPU filter pod
        elif i % FULL_EVERY == 0:
            full.append((name, cpu))
        else:
            ordinary.append(name)
    for name, cpu in full:
        usable = cpu * 1000 * 8 // 10
        all_pods.append(foreign(f"filler-{name}", node=name, cpu=f"{usable - 500}m"))
    pending = [
        vm(f"pending-{k:05d}", namespace=PENDING_NAMESPACE, node=None, vcpus=2 + 2 * (k % 2))
        for k in range(n_pending)
    ]
    all_pods.extend(pending)
    shapes = ["250m", "500m", "1", "2"]
    k = 0
    while len(all_pods) < pods:
        node = ordinary[k % len(ordinary)]
        if rng.random() < 0.5:
            all_pods.append(foreign(f"web-{k:06d}", node=node, cpu=rng.choice(shapes)))
        else:
            # Fixed-size filler VMs: a VM with room to grow that is found running holds that
            # room out of reach until its agent reports (accounting: "Unverified VMs"), and this
            # benchmark runs no agents for these; it measures the steady state after the reports.
            vcpus = rng.choice((1, 2))
            all_pods.append(vm(f"vm-{k:06d}", namespace="vms", node=node, vcpus=vcpus, growth=0))
        k += 1
    # Binds go to the big ordinary nodes, which keep room however the pods fell.
    bind_nodes = [n for n in ordinary if int(n.rsplit("-", 1)[1]) % 2 == 0]  # the 64-core ones
    return Cluster(
        nodes=node_objs,
        pods=all_pods,
        pending=pending,
        bind_nodes=bind_nodes or ordinary,
        permit_nodes=permit_nodes,
    )


# --- role: fake API server ---------------------------------------------------------------------


async def run_fake_api(args: argparse.Namespace) -> None:
    from testkit.kube_api import FakeKubeApi, TokenIdentity, pod_object

    cluster = generate(
        nodes=args.nodes, pods=args.pods, batch=args.batch, binds=args.binds, seed=args.seed
    )
    api = FakeKubeApi()
    for node in cluster.nodes:
        api.add_node(node)
    for pod in cluster.pods:
        api.add_pod(pod)
    for node in cluster.permit_nodes:
        # Only a Running agent pod's token gets permits (issue 16): one per permit node.
        agent = pod_object(
            f"agent-{node}",
            namespace="vm-autoscaling",
            uid=f"agent-uid-{node}",
            node_name=node,
            cpu="10m",
            memory="64Mi",
            scheduler_name="default-scheduler",
            phase="Running",
        )
        agent["spec"]["serviceAccountName"] = "autoscaler-agent"
        api.add_pod(agent)
        api.add_token(
            token_name(node),
            TokenIdentity(
                username="system:serviceaccount:vm-autoscaling:autoscaler-agent",
                audiences=(AUDIENCE,),
                node_name=node,
                pod_name=f"agent-{node}",
                pod_uid=f"agent-uid-{node}",
            ),
        )
    gc.freeze()  # as in the orchestrator: keep the fake's big heap out of GC passes
    url = await api.start()
    _announce({"url": url, "affinity": sorted(os.sched_getaffinity(0))})
    await _until_stdin_closes()
    await api.stop()


# --- role: server (the extender and the bare endpoints) ---------------------------------------


def make_bare_app() -> web.Application:
    """aiohttp with no middleware: read, decode like the extender's handler, answer constant."""
    from protocol.permits import ResourceRequestBatch
    from scheduler_extender.http import verbs

    filter_decoder = msgspec.json.Decoder(verbs.FilterArgs)
    permits_decoder = msgspec.json.Decoder(ResourceRequestBatch)
    empty_filter = msgspec.json.encode(
        {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    )
    empty_permits = msgspec.json.encode({"protocol": 1, "node": "", "permits": []})

    async def bare_filter(request: web.Request) -> web.Response:
        filter_decoder.decode(await request.read())
        return web.Response(body=empty_filter, content_type="application/json")

    # The same floor, answering with the extender's own answer for that pod (set beforehand
    # through /answer): what aiohttp + decoding + sending an answer of that size cost, so the
    # extender's logic can be told apart from the size of the answer the protocol asks for.
    answers: dict[str, bytes] = {}

    async def set_answer(request: web.Request) -> web.Response:
        answers[request.headers["X-Pod-Uid"]] = await request.read()
        return web.Response(status=204)

    async def bare_filter_same_answer(request: web.Request) -> web.Response:
        args = filter_decoder.decode(await request.read())
        body = answers[args.pod.metadata.uid]
        return web.Response(body=body, content_type="application/json")

    async def bare_permits(request: web.Request) -> web.Response:
        permits_decoder.decode(await request.read())
        return web.Response(body=empty_permits, content_type="application/json")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/filter", bare_filter)
    app.router.add_post("/answer", set_answer)
    app.router.add_post("/filter-same-answer", bare_filter_same_answer)
    app.router.add_post("/v1/permits", bare_permits)
    return app


async def run_server(args: argparse.Namespace) -> None:
    from prometheus_client import CollectorRegistry

    from kube_io.client import KubeClient
    from observability.log import configure_logging
    from scheduler_extender.config import parse_config
    from scheduler_extender.http.app import Deps, make_app, make_permits_app
    from scheduler_extender.http.front import PermitFront
    from scheduler_extender.http.keys import EXTENDER, TASKS
    from scheduler_extender.http.permit_port import LocalDesk
    from testkit.kube_api import kubeconfig_for

    configure_logging(level=args.log_level, is_json=True)
    config_data: Obj = {
        "auth": {"mode": "tokenreview", "audience": AUDIENCE},
        "durability": {"write_annotations": False, "resize_pods": False},
        "kube": {"post_events": False},
        # Each simulated agent sends batches back to back to measure capacity; a real one
        # sends about one a second, within the per-agent budget this lifts.
        "limits": {"permit_requests_per_second": 1e9, "permit_requests_burst": 10**9},
    }
    config = parse_config(config_data)
    api_url = args.api_url

    async def connect() -> KubeClient:
        return KubeClient.for_url(api_url)

    # As __main__ builds it, gc.freeze() included (--no-freeze-gc measures without it).
    deps = Deps(registry=CollectorRegistry(), connect_kube=connect, freeze_gc=args.freeze_gc)
    verbs_app = make_app(config, deps)
    ports: dict[str, int] = {}
    apps = [("verbs", verbs_app), ("bare", make_bare_app())]
    front: PermitFront | None = None
    if args.permit_front == "process":
        # As ``serve`` runs it: the permit port in a child process, which reviews tokens with
        # its own client (a kubeconfig for the fake API) and asks this process to decide.
        kubeconfig = Path(tempfile.mkdtemp(prefix="bench-front-")) / "kubeconfig"
        kubeconfig.write_text(json.dumps(kubeconfig_for(api_url)))
        front = PermitFront(
            parse_config(
                {**config_data, "listen": {"permits": {"host": "127.0.0.1", "port": free_port()}}}
            ),
            LocalDesk(verbs_app[EXTENDER], verbs_app[TASKS]),
            kubeconfig=str(kubeconfig),
            log_level=args.log_level,
        )
        front.bind()
        ports["permits"] = front.bound_port
    else:
        apps.insert(1, ("permits", make_permits_app(config, verbs_app)))
    runners: list[web.AppRunner] = []
    for name, app in apps:
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports[name] = runner.addresses[0][1]
    running = asyncio.create_task(front.run()) if front is not None else None
    _announce({"ports": ports, "affinity": sorted(os.sched_getaffinity(0)), "pid": os.getpid()})
    await _until_stdin_closes()
    if front is not None and running is not None:
        await front.stop()
        await asyncio.gather(running, return_exceptions=True)
    for runner in reversed(runners):
        await runner.cleanup()


def _announce(value: Obj) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def _until_stdin_closes() -> None:
    # The orchestrator closes our stdin to stop us: no signals, no stray processes.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


# --- the orchestrator and load generator -------------------------------------------------------


@dataclass
class Child:
    process: subprocess.Popen[str]
    hello: Obj

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def start_child(
    args: argparse.Namespace,
    role: str,
    *extra: str,
    cpus: Collection[int],
    stderr: Any = None,
) -> Child:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        role,
        *(f"--nodes={args.nodes}", f"--pods={args.pods}", f"--batch={args.batch}"),
        *(f"--binds={args.binds}", f"--seed={args.seed}", f"--log-level={args.log_level}"),
        *(() if args.freeze_gc else ("--no-freeze-gc",)),
        f"--permit-front={args.permit_front}",
        *(
            ()
            if role != "server" or args.profile_server is None
            else (f"--profile-server={args.profile_server}",)
        ),
        *extra,
    ]
    with kit.spawning_on(cpus):
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait()
        raise kit.BenchError(f"{role} did not start (exit {process.returncode})")
    return Child(process, json.loads(line))


def progress(message: str) -> None:
    print(f"bench_extender: {message}", file=sys.stderr, flush=True)


def summary(samples: list[float]) -> Obj:
    return kit.summary(samples, unit="ms", percentiles=(50, 90, 99))


async def timed_post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[float, int, bytes]:
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        data = await response.read()
        status = response.status
    return time.perf_counter() - start, status, data


async def compare(
    session: aiohttp.ClientSession,
    targets: dict[str, str],
    bodies: list[bytes],
    *,
    iterations: int,
    warmup: int,
    check: Callable[[bytes], None],
) -> dict[str, Obj]:
    """Sequential calls, alternating blocks between the targets; latency per target."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    block = max(1, min(100, iterations // 10))
    for name, url in targets.items():
        for i in range(warmup):
            _, status, data = await timed_post(session, url, bodies[i % len(bodies)])
            if status != 200:
                raise kit.BenchError(f"{name} {url}: HTTP {status}: {data[:300]!r}")
            if name == "extender":
                check(data)
    done = 0
    while done < iterations:
        n = min(block, iterations - done)
        for name, url in targets.items():
            for i in range(done, done + n):
                took, status, data = await timed_post(session, url, bodies[i % len(bodies)])
                if status != 200:
                    raise kit.BenchError(f"{name} {url}: HTTP {status}: {data[:300]!r}")
                samples[name].append(took)
        done += n
    return {name: summary(s) for name, s in samples.items()}


def filter_bodies(cluster: Cluster, *, is_cache: bool, count: int = 8) -> list[bytes]:
    names = cluster.node_names
    nodes = {"metadata": {}, "items": cluster.nodes}
    # As kube-scheduler sends them: its informer's copy carries the API server's
    # resourceVersion (see shared/reference/kube/extender).
    pods = [
        {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(90_000 + i)}}
        for i, pod in enumerate(cluster.pending[:count])
    ]
    return [
        json.dumps(
            {"Pod": pod, "Nodes": None, "NodeNames": names}
            if is_cache
            else {"Pod": pod, "Nodes": nodes, "NodeNames": None},
            separators=(",", ":"),
        ).encode()
        for pod in pods
    ]


def filter_check(*, is_cache: bool, total: int) -> Callable[[bytes], None]:
    def check(data: bytes) -> None:
        answer = json.loads(data)
        passed = answer["NodeNames"] if is_cache else answer["Nodes"]["items"]
        failed = len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"])
        if not passed and failed == total:
            # The generated cluster keeps some nodes with room: none means the pods filled them.
            raise kit.BenchError(
                f"no node has room for a pending VM ({total} nodes rejected it):"
                " --pods fills --nodes; ask for fewer pods or more nodes"
            )
        if not passed or not failed or len(passed) + failed != total:
            raise kit.BenchError(f"unexpected filter answer: {len(passed)} passed, {failed} failed")

    return check


async def bench_filter(
    session: aiohttp.ClientSession, ports: dict[str, int], cluster: Cluster, args: Any
) -> Obj:
    out: Obj = {}
    for mode, is_cache in (("cache", True), ("nocache", False)):
        bodies = filter_bodies(cluster, is_cache=is_cache)
        iterations = args.iterations if is_cache else args.nocache_iterations
        extender_url = f"http://127.0.0.1:{ports['verbs']}/filter"
        bare_url = f"http://127.0.0.1:{ports['bare']}"
        for pod, body in zip(cluster.pending, bodies, strict=False):
            _, status, answer = await timed_post(session, extender_url, body)
            if status != 200:
                raise kit.BenchError(f"filter: HTTP {status}: {answer[:300]!r}")
            headers = {"X-Pod-Uid": pod["metadata"]["uid"]}
            _, status, _ = await timed_post(session, f"{bare_url}/answer", answer, headers)
        result = await compare(
            session,
            {
                "extender": extender_url,
                "bare": f"{bare_url}/filter",
                "bare_same_answer": f"{bare_url}/filter-same-answer",
            },
            bodies,
            iterations=iterations,
            warmup=max(20, iterations // 10),
            check=filter_check(is_cache=is_cache, total=len(cluster.nodes)),
        )
        ext, bare, same = result["extender"], result["bare"], result["bare_same_answer"]
        out[mode] = {
            "body_bytes": len(bodies[0]),
            **result,
            "ratio_p50": round(ext["p50_ms"] / bare["p50_ms"], 3),
            "ratio_p99": round(ext["p99_ms"] / bare["p99_ms"], 3),
            # What sending the answer itself costs over the empty one, and what the extender
            # adds on top of that.
            "same_answer_vs_bare_p99": round(same["p99_ms"] / bare["p99_ms"], 3),
            "ratio_p99_vs_same_answer": round(ext["p99_ms"] / same["p99_ms"], 3),
        }
    return out


async def bench_bind(session: aiohttp.ClientSession, port: int, cluster: Cluster) -> Obj:
    url = f"http://127.0.0.1:{port}/bind"
    samples = []
    for k, pod in enumerate(cluster.pending):
        meta = pod["metadata"]
        body = json.dumps(
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": cluster.bind_nodes[k % len(cluster.bind_nodes)],
            }
        ).encode()
        took, status, data = await timed_post(session, url, body)
        if status != 200 or json.loads(data).get("Error"):
            raise kit.BenchError(f"bind failed: HTTP {status}: {data[:300]!r}")
        samples.append(took)
    return {"binding_post": "fake API server (real HTTP)", **summary(samples)}


def permit_body(node: str, vms: list[Obj], *, grow: bool) -> bytes:
    current, requested = (1, 2) if grow else (2, 1)
    return json.dumps(
        {
            "protocol": {"min": 1, "max": 1},
            "node": node,
            "requests": [
                {
                    "pod": {
                        "namespace": p["metadata"]["namespace"],
                        "name": p["metadata"]["name"],
                        "uid": p["metadata"]["uid"],
                    },
                    "node": node,
                    "current": {"vcpus": current, "memoryBytes": GIB},
                    "requested": {"vcpus": requested, "memoryBytes": GIB},
                    "load": {"load1": 1.5, "cpuBusyFraction": 0.75},
                }
                for p in vms
            ],
        },
        separators=(",", ":"),
    ).encode()


async def permit_load(
    session: aiohttp.ClientSession,
    url: str,
    cluster: Cluster,
    *,
    seconds: float,
    concurrency: int,
    server_pid: int,
    check: bool,
) -> Obj:
    """``concurrency`` agents, each owning whole nodes (one batch in flight per node, like the
    real agent); every node alternates grow (1 -> 2 vCPUs) and shrink (2 -> 1) batches."""
    plans = [
        (
            node,
            {"Authorization": f"Bearer {token_for(node)}"},
            [permit_body(node, vms, grow=True), permit_body(node, vms, grow=False)],
            len(vms),
        )
        for node, vms in cluster.permit_nodes.items()
    ]
    shares = [plans[i::concurrency] for i in range(concurrency)]
    deadline = 0.0
    counts = {"batches": 0, "vms": 0}
    latencies: list[float] = []

    async def agent(share: list[Any]) -> None:
        turn = 0
        while time.perf_counter() < deadline:
            for _node, headers, bodies, n in share:
                took, status, data = await timed_post(session, url, bodies[turn % 2], headers)
                latencies.append(took)
                if status != 200:
                    raise kit.BenchError(f"permits: HTTP {status}: {data[:300]!r}")
                if check:
                    permits = json.loads(data)["permits"]
                    bad = [p for p in permits if p.get("error") or p.get("status") is None]
                    if bad:
                        raise kit.BenchError(f"permit errors: {bad[:2]}")
                counts["batches"] += 1
                counts["vms"] += n
            turn += 1

    start = time.perf_counter()
    deadline = start + seconds
    cpu_before = cpu_seconds(server_pid)
    front_before = children_cpu_seconds(server_pid)
    await asyncio.gather(*(agent(s) for s in shares if s))
    elapsed = time.perf_counter() - start
    main_cpu = cpu_seconds(server_pid) - cpu_before
    front_cpu = children_cpu_seconds(server_pid) - front_before
    # Both processes' (the permit front's too): what the permits cost the pod.
    cpu = main_cpu + front_cpu
    return {
        "seconds": round(elapsed, 3),
        "batches": counts["batches"],
        "vm_permits": counts["vms"],
        "vm_permits_per_second": round(counts["vms"] / elapsed),
        "server_cpu_seconds": round(cpu, 3),
        "main_process_cpu_seconds": round(main_cpu, 3),
        "vm_permits_per_server_cpu_second": round(counts["vms"] / cpu) if cpu else None,
        "batch_latency": summary(latencies),
    }


async def bench_permits(
    session: aiohttp.ClientSession, ports: dict[str, int], cluster: Cluster, args: Any, pid: int
) -> Obj:
    concurrency = min(args.concurrency, len(cluster.permit_nodes))
    extender_url = f"http://127.0.0.1:{ports['permits']}/v1/permits"
    bare_url = f"http://127.0.0.1:{ports['bare']}/v1/permits"
    common = {"concurrency": concurrency, "server_pid": pid}
    # Warm-up: the first batch of each token is the TokenReview; the rest hit the cache.
    await permit_load(session, extender_url, cluster, seconds=0.5, check=True, **common)
    await permit_load(session, bare_url, cluster, seconds=0.5, check=False, **common)
    seconds = args.permit_seconds
    extender = await permit_load(
        session, extender_url, cluster, seconds=seconds, check=False, **common
    )
    bare = await permit_load(session, bare_url, cluster, seconds=seconds, check=False, **common)
    return {
        "batch_vms": args.batch,
        "nodes": len(cluster.permit_nodes),
        "concurrency": concurrency,
        "auth": "tokenreview against the fake API (first call per token reviews, rest cached)",
        "extender": extender,
        "bare": bare,
        "ratio_throughput": round(
            extender["vm_permits_per_second"] / bare["vm_permits_per_second"], 3
        ),
    }


async def wait_ready(session: aiohttp.ClientSession, port: int, limit_seconds: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < limit_seconds:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                if r.status == 200:
                    return time.perf_counter() - start
        await asyncio.sleep(0.1)
    raise kit.BenchError(f"the extender was not ready after {limit_seconds} s")


async def orchestrate(args: argparse.Namespace) -> Obj:
    started = time.perf_counter()
    cluster = generate(
        nodes=args.nodes, pods=args.pods, batch=args.batch, binds=args.binds, seed=args.seed
    )
    # The load generator's own heap (the cluster, 6 MB bodies) must not cost it full GC
    # passes in the middle of a timed call.
    gc.freeze()
    affinity = sorted(os.sched_getaffinity(0))
    server_cpus, others = kit.split_cpus()
    with tempfile.TemporaryDirectory(prefix="bench-extender-") as tmp:
        log_path = Path(tmp) / "server.log"
        children: list[Child] = []
        try:
            api = start_child(args, "fake-api", cpus=others)
            children.append(api)
            with log_path.open("w") as log_file:
                server = start_child(
                    args,
                    "server",
                    f"--api-url={api.hello['url']}",
                    cpus=server_cpus,
                    stderr=log_file,
                )
            children.append(server)
            os.sched_setaffinity(0, others)
            ports = server.hello["ports"]
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                ready = await wait_ready(session, ports["verbs"], limit_seconds=300)
                progress(f"extender ready after {ready:.1f} s")
                filters = binds = permits = None
                if "filter" in args.phases:
                    progress("filter")
                    filters = await bench_filter(session, ports, cluster, args)
                if "bind" in args.phases:
                    progress("bind")
                    binds = await bench_bind(session, ports["verbs"], cluster)
                if "permits" in args.phases:
                    progress("permits")
                    permits = await bench_permits(
                        session, ports, cluster, args, server.hello["pid"]
                    )
        finally:
            for child in reversed(children):
                child.stop()
        log_lines = sum(1 for _ in log_path.open())
    return {
        "config": {
            "nodes": args.nodes,
            "pods": args.pods,
            "pending_pods": len(cluster.pending),
            "permit_nodes": len(cluster.permit_nodes),
            "seed": args.seed,
            "iterations": {"cache": args.iterations, "nocache": args.nocache_iterations},
            "log_level": args.log_level,
            "phases": args.phases,
            "freeze_gc": args.freeze_gc,
            "python": sys.version.split()[0],
            "affinity": {
                "machine": affinity,
                "server": server.hello["affinity"],
                "load_generator": sorted(os.sched_getaffinity(0)),
                "fake_api": api.hello["affinity"],
            },
            "bare_decodes": "filter: verbs.FilterArgs (the whole Pod as protocol.kube.Pod; "
            "Nodes / NodeNames as msgspec.Raw), permits: protocol.permits.ResourceRequestBatch; "
            "the same types the extender's handlers decode first",
        },
        "startup_to_ready_seconds": round(ready, 2),
        "filter": filters,
        "bind": binds,
        "permits": permits,
        "ratios": {
            "filter_cache_p99_vs_bare": filters["cache"]["ratio_p99"] if filters else None,
            "filter_nocache_p99_vs_bare": filters["nocache"]["ratio_p99"] if filters else None,
            "filter_cache_p99_vs_bare_same_answer": (
                filters["cache"]["ratio_p99_vs_same_answer"] if filters else None
            ),
            "filter_nocache_p99_vs_bare_same_answer": (
                filters["nocache"]["ratio_p99_vs_same_answer"] if filters else None
            ),
            "vm_permits_per_second": permits["extender"]["vm_permits_per_second"]
            if permits
            else None,
        },
        "server_log_lines": log_lines,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = kit.command(__doc__)
    parser.add_argument("--nodes", type=int, default=5000, help="nodes in the fake API server")
    parser.add_argument(
        "--pods", type=int, default=50_000, help="pods already bound across those nodes"
    )
    parser.add_argument("--iterations", type=int, default=2000, help="cache-mode filter calls")
    parser.add_argument(
        "--nocache-iterations",
        type=int,
        default=None,
        help="non-cache filter calls (default: --iterations; each body carries every Node)",
    )
    parser.add_argument("--batch", type=int, default=50, help="VMs per permit batch")
    parser.add_argument("--binds", type=int, default=500, help="pending pods to bind")
    parser.add_argument(
        "--permit-seconds", type=float, default=5.0, help="seconds of permit traffic measured"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="agents sending permits")
    parser.add_argument(
        "--permit-front",
        choices=["process", "inline"],
        default="process",
        help="process (default, as `serve` runs it): the permit port in the server's child"
        " process, which inherits its CPU; inline: on the server's own event loop",
    )
    parser.add_argument("--seed", type=int, default=42, help="seed of the generated cluster")
    parser.add_argument("--log-level", default="info", help="the extender's (default: info)")
    parser.add_argument("--write", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--phases",
        type=lambda v: [p for p in v.split(",") if p],
        default=["filter", "bind", "permits"],
        help="comma-separated subset of filter,bind,permits (default: all)",
    )
    parser.add_argument(
        "--no-freeze-gc",
        dest="freeze_gc",
        action="store_false",
        help="do not gc.freeze() the server after its first lists (to measure what it buys)",
    )
    parser.add_argument(
        "--profile-server",
        type=Path,
        help="run the extender's process under cProfile and write its stats here (slows it)",
    )
    parser.add_argument("--role", choices=("fake-api", "server"), help=argparse.SUPPRESS)
    parser.add_argument("--api-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.phases) - {"filter", "bind", "permits"}
    if unknown:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown))}")
    if args.nocache_iterations is None:
        args.nocache_iterations = args.iterations
    if args.role == "fake-api":
        asyncio.run(run_fake_api(args))
        return
    if args.role == "server":
        if args.profile_server is None:
            asyncio.run(run_server(args))
            return
        import cProfile

        with cProfile.Profile() as profile:
            asyncio.run(run_server(args))
        profile.dump_stats(args.profile_server)
        return
    kit.emit(asyncio.run(orchestrate(args)), write=args.write)


if __name__ == "__main__":
    kit.main(main)
