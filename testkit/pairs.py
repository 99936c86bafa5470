"""Scheduler pods for the failover tests and benchmark: kube-scheduler and its extender, as
the two containers of one replica of ``manifests/extender.yaml``, with leader election on.

Each ``SchedulerPod`` runs its kube-scheduler under a host name of its own (kube-scheduler
names itself in its Lease after the host, as in a pod) and its extender with ``POD_NAME`` /
``POD_NAMESPACE`` set to a Pod object of the same name (nobody runs it: it is there to carry
the role label the leader sets). The lease durations are short (``LEASE_SECONDS``) so that a
failover costs a few seconds; everything else is the deployed configuration.

``Agents`` plays the autoscaler-agents of a group of nodes: one token per node, one request
per VM at a time, through "the Service" (the pod whose extender is the leader; a 503 from a
standby is retried on the other, as the Service's next connection would be).
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testkit.cluster import AGENT_NS, AGENT_SA, Names, agent_pod, new_extender
from testkit.controlplane import (
    EXTENDER_NS,
    MANIFEST_EXTENDER_CONFIG,
    MANIFEST_SCHEDULER_CONFIG,
    Api,
    ControlPlane,
    Extender,
    LaggingLink,
    Obj,
    Scheduler,
    extender_token,
    pod_path,
    scheduler_config,
    wait_for,
)

# kube-scheduler's leaderElection and the extender's, scaled down from 15 s / 10 s / 2 s.
LEASE_SECONDS = 3
RENEW_DEADLINE_SECONDS = 2
RETRY_SECONDS = 0.5
ROLE_LABEL = "vm-autoscaling.io/extender-role"
GIB = 2**30


@dataclass(frozen=True)
class Leases:
    """kube-scheduler's leaderElection timing, which the extender's Lease follows."""

    duration_seconds: int = LEASE_SECONDS
    renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS
    retry_seconds: float = RETRY_SECONDS


SHORT = Leases()
# As deployed (manifests/config/kube-scheduler.yaml).
DEPLOYED = Leases(15, 10, 2)


def with_leases(config: Obj, leases: Leases) -> Obj:
    """The deployed KubeSchedulerConfiguration with leader election on, timed by ``leases``."""
    config["leaderElection"] = {
        **MANIFEST_SCHEDULER_CONFIG["leaderElection"],
        "leaderElect": True,
        "leaseDuration": f"{leases.duration_seconds}s",
        "renewDeadline": f"{leases.renew_deadline_seconds:g}s",
        "retryPeriod": f"{leases.retry_seconds:g}s",
    }
    return config


@dataclass
class SchedulerPod:
    name: str
    extender: Extender
    scheduler: Scheduler
    link: LaggingLink | None = None

    def start(self) -> None:
        self.extender.start(wait_ready=False)
        self.scheduler.start()
        wait_for(
            lambda: self.extender.get("/readyz?exclude=leader")[0] == 200,
            timeout_seconds=30,
            what=f"{self.name}'s extender synced",
        )

    def is_leader(self) -> bool:
        """Its extender decides: /readyz (with the leadership check) says so."""
        if self.extender.process is None or self.extender.process.popen.poll() is not None:
            return False
        return self.extender.get("/readyz", port=self.extender.verbs_port)[0] == 200

    def kill(self) -> None:
        """The pod dies: both containers at once, no goodbye (SIGKILL)."""
        for process in (self.extender.process, self.scheduler.process):
            if process is not None and process.popen.poll() is None:
                process.popen.send_signal(signal.SIGKILL)
        for process in (self.extender.process, self.scheduler.process):
            if process is not None:
                process.popen.wait()

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()
        if self.link is not None:
            self.link.release()
            self.link.close()


def scheduler_pod(
    cp: ControlPlane,
    kubeconfig: Path,
    work: Path,
    name: str,
    *,
    partitionable: bool = False,
    extender_only: bool = False,
    leases: Leases | None = SHORT,
    quick_backoff: bool = True,
) -> SchedulerPod:
    """One replica. ``partitionable``: both containers reach the API server through one
    ``LaggingLink`` (no lag) that the test can ``hold``; with ``extender_only``, only the
    extender does (kube-scheduler keeps its own way in). ``leases=None``: the only replica,
    no leader election at all (as before there were two). ``quick_backoff``: kube-scheduler
    retries a pod whose cycle failed (the extender refused: no leader yet) after at most 1 s
    instead of up to 10 s, so that a test's failover costs seconds, not tens of them; the
    benchmark keeps the deployed back-off."""
    work = work / name
    work.mkdir(parents=True, exist_ok=True)
    api = cp.admin()
    try:
        api.create(
            pod_path(EXTENDER_NS),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                # As the Deployment's template: every replica starts as the standby.
                "metadata": {
                    "name": name,
                    "namespace": EXTENDER_NS,
                    "labels": {ROLE_LABEL: "standby"},
                },
                "spec": {
                    "nodeName": f"{name}-nowhere",
                    "containers": [{"name": "extender", "image": "extender"}],
                },
            },
        )
    except Exception as e:  # already there from an earlier run of the same name
        if "409" not in str(e):
            raise
    finally:
        api.close()
    link = None
    extender_kubeconfig = kubeconfig
    if partitionable:
        link = LaggingLink(cp.port, delay_seconds=0.0)
        extender_kubeconfig = cp.write_kubeconfig(
            work / "link.kubeconfig", token=extender_token(kubeconfig), port=link.port
        )
        if not extender_only:
            kubeconfig = extender_kubeconfig
    election = (
        {
            **MANIFEST_EXTENDER_CONFIG["leader_election"],
            "lease_duration_seconds": leases.duration_seconds,
            "renew_seconds": leases.retry_seconds,
            "retry_seconds": leases.retry_seconds,
        }
        if leases is not None
        else None
    )
    extender = new_extender(cp, extender_kubeconfig, work, leader_election=election)
    extender.env = {"POD_NAME": name, "POD_NAMESPACE": EXTENDER_NS}
    config = scheduler_config(
        MANIFEST_SCHEDULER_CONFIG, kubeconfig=kubeconfig, verbs_port=extender.verbs_port
    )
    if quick_backoff:
        config["podInitialBackoffSeconds"] = 1
        config["podMaxBackoffSeconds"] = 1
    scheduler = Scheduler(
        cp.bin_dir,
        work,
        cp,
        with_leases(config, leases) if leases is not None else config,
        hostname=name if leases is not None else None,
    )
    return SchedulerPod(name, extender, scheduler, link)


def wait_leader(pods: list[SchedulerPod], *, timeout_seconds: float = 30) -> SchedulerPod:
    leader: SchedulerPod = wait_for(
        lambda: next((p for p in pods if p.is_leader()), None),
        timeout_seconds=timeout_seconds,
        what="a leading extender",
        interval=0.02,
    )
    return leader


def role_label(api_pod: Obj) -> str | None:
    label: str | None = api_pod["metadata"].get("labels", {}).get(ROLE_LABEL)
    return label


# --- the agents ---------------------------------------------------------------------------


@dataclass
class Grant:
    """A 200 answer an agent applied: from which extender, when (test clock), how big."""

    pod: str
    vm: str
    vcpus: int
    at: float
    # More than the VM ran before: a grant proper, not a steady or shrinking answer.
    grew: bool = False
    # The answering extender's epoch (new with every process and every term it leads).
    epoch: str = ""


@dataclass
class Agents:
    """The agents of ``names``' nodes. ``sizes``: what each VM really runs (what its agent
    applied); ``last``: its last permit; every applied grant in ``grants``."""

    names: Names
    tokens: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)
    refusals: int = 0

    def token(self, node: str) -> str:
        if node not in self.tokens:
            pod = agent_pod(self.names, node)
            self.tokens[node] = self.names.api.request_token(AGENT_NS, AGENT_SA, pod=pod)
        return self.tokens[node]

    def ask(
        self, pods: list[SchedulerPod], vm: Obj, *, requested: int, tries: int = 4
    ) -> int | None:
        """One request for ``vm`` (bound), through whichever pod answers as the leader; the
        granted vCPUs (applied), or None when nobody would decide."""
        meta = vm["metadata"]
        node = vm["spec"]["nodeName"]
        name = meta["name"]
        current = self.sizes.setdefault(name, 1)
        request: Obj = {
            "pod": {"namespace": meta["namespace"], "name": name, "uid": meta["uid"]},
            "node": node,
            "current": {"vcpus": current, "memoryBytes": GIB},
            "requested": {"vcpus": requested, "memoryBytes": GIB},
        }
        if name in self.last:
            request["lastPermit"] = {"vcpus": self.last[name], "memoryBytes": GIB}
        batch = {"protocol": {"min": 1, "max": 1}, "node": node, "requests": [request]}
        for attempt in range(tries):
            for pod in pods:
                answer = _post(pod, batch, self.token(node))
                if answer is None:
                    continue
                (permit,) = answer["permits"]
                granted: int = permit["permit"]["vcpus"]
                self.sizes[name] = requested if requested < current else granted
                self.last[name] = granted
                self.grants.append(
                    Grant(
                        pod.name,
                        name,
                        granted,
                        time.monotonic(),
                        grew=granted > current,
                        epoch=answer["epoch"],
                    )
                )
                return granted
            self.refusals += 1
            time.sleep(0.05 * (attempt + 1))
        return None


def _post(pod: SchedulerPod, batch: Obj, token: str) -> Obj | None:
    """The answer of ``pod``'s permit port, or None (dead, standby, or refusing)."""
    process = pod.extender.process
    if process is None or process.popen.poll() is not None:
        return None
    conn = http.client.HTTPConnection("127.0.0.1", pod.extender.permits_port, timeout=5)
    try:
        conn.request(
            "POST",
            "/v1/permits",
            body=json.dumps(batch),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        response = conn.getresponse()
        raw = response.read()
    except OSError:
        return None
    finally:
        conn.close()
    if response.status != 200:
        return None
    answer: Obj = json.loads(raw)
    return answer


def usable_millis(state: Obj, node: str) -> int:
    (found,) = [n for n in state["nodes"] if n["name"] == node]
    cpu: int = found["capacity"]["cpuMillis"] - found["systemReserve"]["cpuMillis"]
    return cpu


def iter_bound(names: Names, api: Api | None = None) -> Iterator[Obj]:
    """``names``' bound VM pods (through ``api``: one per thread, ``Api`` is not shared)."""
    for pod in (api or names.api).get(pod_path(names.namespace))["items"]:
        if pod["spec"].get("nodeName") and pod["metadata"]["name"].startswith("vm-"):
            yield pod
