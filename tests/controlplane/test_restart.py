"""The extender SIGKILLed and started again rebuilds the same ledger from the API server.

Its own module (and extender): the test kills it. The link to the API server lags, so the
new process's first lists take long enough to see ``/readyz`` say 503 before it says 200.
"""

from __future__ import annotations

import signal

from testkit.cluster import Cluster, Names, agent_pod, permit_batch
from testkit.controlplane import Obj, wait_for


def ours(state: Obj, group: str) -> list[Obj]:
    """This test's nodes as /state shows them (other tests' nodes may come and go)."""
    return [n for n in state["nodes"] if n["name"].startswith(group)]


def test_a_killed_extender_rebuilds_the_same_state(lagging: Cluster, names: Names):
    node = names.node("a", cpu="10")
    names.foreign("app", node=node, cpu="1")
    for i in range(3):
        names.vm(f"vm-{i}", max_vcpus=4)
    for i in range(3):
        names.wait_bound(f"vm-{i}")
    vm = names.api.pod(names.namespace, "vm-1")
    token = names.api.request_token(
        "vm-autoscaling", "autoscaler-agent", pod=agent_pod(names, node)
    )
    status, body = lagging.extender.post(
        "/v1/permits",
        permit_batch(node, vm, current=1, requested=3),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert status == 200, body
    wait_for(
        lambda: (
            names.api.pod(names.namespace, "vm-1")["metadata"]
            .get("annotations", {})
            .get("vm-autoscaling.io/permitted-vcpus")
            == "3"
        ),
        timeout_seconds=30,
        what="the permit recorded on the pod",
    )
    before = ours(lagging.extender.state(), names.group)

    lagging.extender.stop(sig=signal.SIGKILL)
    lagging.extender.start(wait_ready=False)
    statuses = []

    def ready() -> bool:
        # The main process's own answer (the verbs port): the permit port's /readyz relays it
        # through the permit front, which starts a moment after the lists may be in.
        status = lagging.extender.get("/readyz", port=lagging.extender.verbs_port)[0]
        statuses.append(status)
        return status == 200

    wait_for(ready, timeout_seconds=60, what="the restarted extender ready")
    # Not ready while it lists: an answer from a half-built ledger would over-commit.
    assert 503 in statuses, statuses
    wait_for(
        lambda: lagging.extender.get("/readyz")[0] == 200,
        timeout_seconds=60,
        what="the permit port ready too",
    )
    after = ours(lagging.extender.state(), names.group)
    # Every hold is back, at the recorded permit.
    assert holds(after) == holds(before)
    assert sorted(a["vm"]["vcpus"] for a in after[0]["allocations"]) == [1, 1, 3]
    # Until each VM's agent reports, a rebuilt ledger cannot know the VM did not grow to its
    # maximum meanwhile: that room is kept out of reach (``uncertain``), never handed out.
    assert after[0]["uncertain"]["cpuMillis"] == 3 * 4000 - 5000
    # The agent's next report (its VMs as they are) settles it: everything as before.
    vms = [names.api.pod(names.namespace, f"vm-{i}") for i in range(3)]
    report = permit_batch(node, vms[0], current=1, requested=1)
    report["requests"] += [
        permit_batch(node, vms[1], current=3, requested=3)["requests"][0],
        permit_batch(node, vms[2], current=1, requested=1)["requests"][0],
    ]
    status, body = lagging.extender.post(
        "/v1/permits", report, headers={"Authorization": f"Bearer {token}"}
    )
    assert status == 200, body
    settled = ours(lagging.extender.state(), names.group)
    assert holds(settled) == holds(before)
    assert numbers(settled) == numbers(before)


HOLD_KEYS = ("pod", "uid", "resources", "requests", "priority", "vm")


def holds(nodes: list[Obj]) -> list[tuple[str, list[Obj], list[Obj]]]:
    """Who holds what, without when (a rebuilt hold is dated by the rebuild)."""

    def kept(allocations: list[Obj]) -> list[Obj]:
        return [{k: a.get(k) for k in HOLD_KEYS} for a in allocations]

    return [(n["name"], kept(n["allocations"]), kept(n["foreignAllocations"])) for n in nodes]


def numbers(nodes: list[Obj]) -> list[Obj]:
    keys = ("capacity", "systemReserve", "allocated", "occupied", "uncertain", "free")
    return [{k: n[k] for k in keys} for n in nodes]
