"""Two scheduler pods, one leader: the leader dies or is cut off, the standby takes over.

Each pod is kube-scheduler and its extender (``pairs.py``), with the deployed configs and
leader election on, its Leases timed short (``LEASE_SECONDS``). What a failover must keep:

* the standby leads within the Leases' bounds (kube-scheduler's, then the extender's own);
* no node is ever over-committed: at every sample, what the agents really run (every grant
  they applied, from whichever extender) fits each node, and no live ledger is over;
* no grant is lost (the new leader's ledger ends with every VM at the size its agent runs),
  the VMs still pending bind, and the agents' permits resume;
* a leader cut off from the API server (its connection held, not closed) grants nothing once
  another leads, although the agents can still reach it.
"""

from __future__ import annotations

import datetime
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Names
from testkit.controlplane import (
    EXTENDER_NS,
    WRITE_VERBS,
    ControlPlane,
    Obj,
    pod_path,
    wait_for,
)
from testkit.pairs import (
    LEASE_SECONDS,
    RETRY_SECONDS,
    Agents,
    SchedulerPod,
    iter_bound,
    role_label,
    scheduler_pod,
    usable_millis,
    wait_leader,
)

# The longest a standby may take to lead after the leader's pod dies: kube-scheduler's
# elector takes the Lease once it has stood still for its duration (read every retry period,
# jittered by 1.2), the extender's elector then takes its own the same way; plus the
# processes' own slowness on a busy 2-core machine.
TAKEOVER_BOUND_SECONDS = 2 * (LEASE_SECONDS + 1.2 * RETRY_SECONDS) + 4.0


@pytest.fixture
def pods(
    control_plane: ControlPlane, extender_kubeconfig: Path, tmp_path: Path
) -> Iterator[list[SchedulerPod]]:
    made: list[SchedulerPod] = []
    yield made
    for pod in made:
        pod.stop()


class Sampler:
    """Every ~50 ms: what the agents run fits each node, and no live ledger is over."""

    def __init__(self, names: Names, agents: Agents, pods: list[SchedulerPod], nodes: list[str]):
        self.names, self.agents, self.pods, self.nodes = names, agents, pods, nodes
        self.usable: dict[str, int] = {}
        self.where: dict[str, str] = {}
        self.samples = 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pod in self.pods:
                if pod.extender.process is None or pod.extender.process.popen.poll() is not None:
                    continue
                status, body = pod.extender.get("/state", port=pod.extender.verbs_port)
                if status != 200:
                    continue
                state = json.loads(body)
                for node in state["nodes"]:
                    if node["name"] in self.nodes:
                        self.usable[node["name"]] = usable_millis(state, node["name"])
                        if node["overcommitted"]:
                            self.problems.append(f"{pod.name}'s ledger: {node['name']} over")
                        for a in node["allocations"]:
                            self.where[a["pod"].split("/")[1]] = node["name"]
            used: dict[str, int] = {}
            for vm, node in list(self.where.items()):
                used[node] = used.get(node, 0) + 1000 * self.agents.sizes.get(vm, 1)
            for node, millis in used.items():
                if node in self.usable and millis > self.usable[node]:
                    self.problems.append(f"{node}: VMs run {millis}m of {self.usable[node]}m")
            self.samples += 1


def test_the_standby_takes_over_mid_burst(
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    tmp_path: Path,
    names: Names,
    pods: list[SchedulerPod],
):
    a = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-a")
    pods.append(a)
    a.start()
    assert wait_leader([a]) is a
    b = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-b")
    pods.append(b)
    b.start()
    # The standby is warm (synced) but decides nothing, and says so.
    assert not b.is_leader()
    assert b.extender.get("/readyz")[0] == 503
    wait_for(
        lambda: (
            [role_label(control_plane_pod(names, p.name)) for p in (a, b)] == ["leader", "standby"]
        ),
        timeout_seconds=10,
        what="the role labels",
    )
    nodes = [names.node("a", cpu="16"), names.node("b", cpu="16")]
    for i in range(4):
        names.vm(f"vm-{i}", max_vcpus=4)
    for i in range(4):
        names.wait_bound(f"vm-{i}")
    agents = Agents(names)
    for node in nodes:
        agents.token(node)
    rng = random.Random(31)
    stop = threading.Event()
    binds: dict[str, float] = {}

    def create_vms() -> None:
        # Its own connection: ``Api`` is not shared between threads.
        mine = Names(control_plane.admin(), names.namespace, names.group)
        for i in range(4, 12):
            mine.vm(f"vm-{i}", max_vcpus=4)
            time.sleep(0.15)
        mine.api.close()

    def ask_permits() -> None:
        api = control_plane.admin()
        while not stop.is_set():
            bound = list(iter_bound(names, api))
            for vm in bound:
                binds.setdefault(vm["metadata"]["name"], time.monotonic())
                agents.ask(pods, vm, requested=rng.randint(1, 2))
            time.sleep(0.02)
        api.close()

    with Sampler(names, agents, pods, nodes) as sampler:
        creator = threading.Thread(target=create_vms)
        asker = threading.Thread(target=ask_permits)
        creator.start()
        asker.start()
        wait_for(lambda: len(agents.grants) >= 8, timeout_seconds=30, what="grants from a")
        killed_at = time.monotonic()
        a.kill()
        assert wait_leader(pods, timeout_seconds=30) is b
        took = time.monotonic() - killed_at
        creator.join()
        # Every VM binds, and each one's agent has heard from b.
        wait_for(
            lambda: len(list(iter_bound(names))) == 12,
            timeout_seconds=30,
            what="every VM bound",
        )
        wait_for(
            lambda: {g.vm for g in agents.grants if g.pod == "ha-b"} >= set(binds),
            timeout_seconds=30,
            what="every agent answered by b",
        )
        stop.set()
        asker.join()
    assert took <= TAKEOVER_BOUND_SECONDS, took
    assert sampler.samples > 20
    assert sampler.problems == []
    # No grant lost: b's ledger ends with every VM at the size its agent runs.
    vcpus = {
        a_["pod"].split("/")[1]: a_["vm"]["vcpus"]
        for n in b.extender.state()["nodes"]
        if n["name"] in nodes
        for a_ in n["allocations"]
    }
    assert vcpus == {vm: agents.sizes.get(vm, 1) for vm in vcpus}
    assert len(vcpus) == 12
    assert any(g.pod == "ha-a" for g in agents.grants)
    assert any(g.pod == "ha-b" and g.at > killed_at for g in agents.grants)
    wait_for(
        lambda: role_label(control_plane_pod(names, "ha-b")) == "leader",
        timeout_seconds=10,
        what="b labelled leader",
    )


def test_a_partitioned_leader_grants_nothing_once_another_leads(
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    tmp_path: Path,
    names: Names,
    pods: list[SchedulerPod],
):
    c = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-c", partitionable=True)
    pods.append(c)
    c.start()
    assert wait_leader([c]) is c
    d = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-d")
    pods.append(d)
    d.start()
    names.node("a", cpu="16")
    names.vm("vm-0", max_vcpus=4)
    names.wait_bound("vm-0")
    vm = names.api.pod(names.namespace, "vm-0")
    agents = Agents(names)
    # Through c alone, as an agent that still reaches it would (its token now reviewed).
    assert agents.ask([c], vm, requested=2) == 2
    assert c.link is not None
    c.link.hold()
    held_at = time.monotonic()
    answers: list[tuple[float, bool]] = []
    d_leads_at: float | None = None
    while time.monotonic() - held_at < 30:
        size = agents.sizes["vm-0"]
        granted = agents.ask([c], vm, requested=3 if size == 2 else 2, tries=1)
        answers.append((time.monotonic(), granted is not None))
        if d_leads_at is None and d.is_leader():
            d_leads_at = time.monotonic()
        if d_leads_at is not None and time.monotonic() - d_leads_at > 1:
            break
        time.sleep(0.05)
    assert d_leads_at is not None, "the standby never took over"
    granted_times = [t for t, ok in answers if ok]
    # c went on granting while its hold lasted (it may: nobody else decided)...
    assert granted_times and granted_times[0] < d_leads_at
    # ...and granted nothing once d led, although it answered (503) all along.
    assert all(t < d_leads_at for t in granted_times), (granted_times, d_leads_at)
    assert not c.is_leader()
    assert c.extender.get("/readyz")[0] == 503
    # Back in touch, c stays the standby: d holds the Lease.
    c.link.release()
    time.sleep(2 * RETRY_SECONDS)
    assert d.is_leader() and not c.is_leader()
    assert agents.ask([c, d], vm, requested=3) == 3
    assert agents.grants[-1].pod == "ha-d"


def control_plane_pod(names: Names, name: str) -> Obj:
    return names.api.get(pod_path(EXTENDER_NS, name))


def test_a_leader_restarted_in_place_takes_its_lease_back(
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    tmp_path: Path,
    names: Names,
    pods: list[SchedulerPod],
):
    """Only the leader's extender dies (the kubelet restarts the container): its pod's name is
    on the Lease, so the new process takes it back without a transfer, from the restart path
    (a new epoch), while its kube-scheduler goes on leading."""
    e = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-e")
    pods.append(e)
    e.start()
    assert wait_leader([e]) is e
    f = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-f")
    pods.append(f)
    f.start()
    names.node("a", cpu="16")
    names.vm("vm-0", max_vcpus=4)
    names.wait_bound("vm-0")
    vm = names.api.pod(names.namespace, "vm-0")
    agents = Agents(names)
    assert agents.ask([e, f], vm, requested=2) == 2
    before = lease(names, "vm-scheduler-extender")

    e.extender.stop(sig=signal.SIGKILL)
    e.extender.start(wait_ready=False)
    assert wait_leader([e, f]) is e
    after = lease(names, "vm-scheduler-extender")
    assert after["holderIdentity"] == before["holderIdentity"] == "ha-e"
    assert after["leaseTransitions"] == before["leaseTransitions"]
    # The new process answers (a new epoch: the agent reports, and the VM is settled).
    assert agents.ask([e, f], vm, requested=3) == 3
    assert agents.grants[-1].epoch != agents.grants[0].epoch
    names.vm("vm-1", max_vcpus=4)
    names.wait_bound("vm-1")


def lease(names: Names, name: str) -> Obj:
    spec: Obj = names.api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NS}/leases/{name}"
    )["spec"]
    return spec


def test_an_extender_cut_off_while_its_scheduler_leads_makes_the_pair_step_down(
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    tmp_path: Path,
    names: Names,
    pods: list[SchedulerPod],
):
    """Only the leader's extender loses the API server; its kube-scheduler keeps leading, so
    the standby may not stand and nobody decides. The extender says it is stalled on
    ``/healthz``, which is kube-scheduler's liveness probe too: the test plays the kubelet
    and restarts that kube-scheduler on the first failure; it releases its Lease on SIGTERM,
    and the standby pair takes both Leases and binds."""
    g = scheduler_pod(
        control_plane, extender_kubeconfig, tmp_path, "ha-g", partitionable=True, extender_only=True
    )
    pods.append(g)
    g.start()
    assert wait_leader([g]) is g
    h = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-h")
    pods.append(h)
    h.start()
    names.node("a", cpu="16")
    names.vm("vm-0", max_vcpus=4)
    names.wait_bound("vm-0")
    assert g.link is not None
    g.link.hold()
    cut_at = time.monotonic()
    status, body = wait_for(
        lambda: found if (found := g.extender.get("/healthz"))[0] != 200 else None,
        timeout_seconds=LEASE_SECONDS + 4 * RETRY_SECONDS + 10,
        what="g's /healthz failing",
        interval=0.1,
    )
    stalled_after = time.monotonic() - cut_at
    assert status == 503 and body.startswith(b"stalled"), (status, body)
    # The hole: g's kube-scheduler leads, so h stands for nothing, and nobody decides.
    assert not g.is_leader() and not h.is_leader()
    assert h.extender.get("/healthz")[0] == 200
    names.vm("vm-1", max_vcpus=4)
    # The kubelet: g's kube-scheduler fails its liveness probe (g's /healthz), so it is
    # restarted (SIGTERM: it releases its Lease), again while the probe fails. A restarted
    # kube-scheduler may win the released Lease back before h's; then it is restarted again,
    # after the kubelet's back-off (10 s from the second restart, scaled here to a lease),
    # which h's kube-scheduler, retrying every retry period, cannot miss.
    restarts = 0
    probe_from = 0.0
    while not h.is_leader():
        now = time.monotonic()
        assert now - cut_at < TAKEOVER_BOUND_SECONDS + 2 * LEASE_SECONDS + 10, (
            restarts,
            lease(names, "vm-scheduler"),
            lease(names, "vm-scheduler-extender"),
        )
        if now >= probe_from and g.extender.get("/healthz")[0] != 200:
            g.scheduler.stop()
            if restarts:
                time.sleep(LEASE_SECONDS)
            g.scheduler.start()
            restarts += 1
            probe_from = time.monotonic() + LEASE_SECONDS  # the probe's initial delay
        time.sleep(RETRY_SECONDS / 5)
    took = time.monotonic() - cut_at
    print(
        f"stalled after {stalled_after:.2f} s, h leads {took:.2f} s after the cut,"
        f" {restarts} restart(s) of g's kube-scheduler"
    )
    assert 1 <= restarts <= 3
    names.wait_bound("vm-1")
    assert took <= TAKEOVER_BOUND_SECONDS + (restarts - 1) * 2 * LEASE_SECONDS, (
        stalled_after,
        took,
        restarts,
    )
    # Back in touch, g sees its kube-scheduler is the standby now: healthy, not deciding.
    g.link.release()
    wait_for(
        lambda: g.extender.get("/healthz")[0] == 200,
        timeout_seconds=10,
        what="g's /healthz again",
    )
    assert h.is_leader() and not g.is_leader()


def _log_events(pod: SchedulerPod, event: str) -> list[Obj]:
    assert pod.extender.process is not None
    found = []
    for line in pod.extender.process.log_path.read_text(errors="replace").splitlines():
        if f'"{event}"' in line:
            decoded: Obj = json.loads(line)
            if decoded.get("event") == event:
                found.append(decoded)
    return found


def _at(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def test_a_deposed_leader_writes_nothing_and_no_binding_fails_on_the_leaders_own_patch(
    control_plane: ControlPlane,
    extender_kubeconfig: Path,
    tmp_path: Path,
    names: Names,
    pods: list[SchedulerPod],
):
    """A planned hand-over (the leader's kube-scheduler stops: it releases its Lease, and its
    extender resigns), with VMs waiting for room that frees while the old leader still
    watches, seen through the API server's audit log (each replica its own user agent):

    * after ``leadership_lost`` the deposed extender's one write is its Lease's release:
      no wake-up, Event, label or annotation, although its watch sees the room free;
    * the new leader relabels the pods (its own "leader", the old one's "standby");
    * no Binding of the extenders fails with 409 on a write of the same extender to that
      pod (its fence, its wake-ups).
    """
    k = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-k")
    pods.append(k)
    k.start()
    assert wait_leader([k]) is k
    m = scheduler_pod(control_plane, extender_kubeconfig, tmp_path, "ha-m")
    pods.append(m)
    m.start()
    names.node("a", cpu="4")
    vms = [f"vm-{i}" for i in range(6)]
    for vm in vms:
        names.vm(vm)

    def placed() -> tuple[list[str], list[str]] | None:
        bound = [vm for vm in vms if names.node_of(vm)]
        waiting = [vm for vm in vms if vm not in bound and names.failed_scheduling(vm)]
        return (bound, waiting) if len(bound) + len(waiting) == len(vms) else None

    bound, waiting = wait_for(placed, timeout_seconds=30, what="every VM bound or waiting")
    assert len(bound) >= 2 and len(waiting) >= 2, (bound, waiting)

    k.scheduler.stop()  # SIGTERM: it releases its Lease; k's extender resigns
    (lost,) = wait_for(
        lambda: _log_events(k, "leadership_lost"),
        timeout_seconds=10,
        what="k's leadership_lost",
        interval=0.01,
    )
    # Room frees at once: both extenders' watches see it, the deposed one included.
    for vm in bound[:2]:
        names.api.delete(pod_path(names.namespace, vm))
    assert wait_leader([k, m], timeout_seconds=TAKEOVER_BOUND_SECONDS) is m
    wait_for(
        lambda: sum(1 for vm in waiting if names.node_of(vm)) == 2,
        timeout_seconds=30,
        what="two waiting VMs bound in the room freed",
    )
    wait_for(
        lambda: (
            [role_label(control_plane_pod(names, p.name)) for p in (k, m)] == ["standby", "leader"]
        ),
        timeout_seconds=10,
        what="m's relabelling",
    )

    k_agent, m_agent = "scheduler-extender (ha-k)", "scheduler-extender (ha-m)"
    events = control_plane.audit_events(user_agent_prefix="scheduler-extender (ha-")
    writes = [e for e in events if e["verb"] in WRITE_VERBS]
    lost_at = _at(lost["timestamp"])
    after = [
        f"{e['verb']} {e['requestURI']} {e['responseStatus']['code']}"
        for e in writes
        if e["userAgent"] == k_agent and _at(e["requestReceivedTimestamp"]) > lost_at
    ]
    # Its release of the extender's Lease, and nothing else.
    assert len(after) == 1 and "/leases/vm-scheduler-extender" in after[0], after
    # The new leader wrote the old one's label.
    assert any(
        e["userAgent"] == m_agent and e["objectRef"].get("name") == "ha-k" for e in writes
    ), writes
    # No Binding failed on its own extender's write to the pod.
    last_writer: dict[str, str] = {}
    own = []
    for e in writes:
        ref = e["objectRef"]
        if ref.get("resource") != "pods":
            continue
        if (
            ref.get("subresource") == "binding"
            and e["responseStatus"]["code"] == 409
            and last_writer.get(ref["name"]) == e["userAgent"]
        ):
            own.append(ref["name"])
        last_writer[ref["name"]] = e["userAgent"]
    bindings = [e for e in writes if e["objectRef"].get("subresource") == "binding"]
    print(
        f"{len(bindings)} Bindings by the extenders,"
        f" {sum(e['responseStatus']['code'] == 409 for e in bindings)} refused (409);"
        f" the deposed one's writes after leadership_lost: {after}"
    )
    assert len(bindings) >= len(bound) + 2
    assert own == [], own
