"""The tier's nodes are one cluster: pods on different nodes reach each other, the Services and
the cluster DNS, and the deployment as written spreads over them.

What is checked from inside pods, with the agent's own image (one agent per node, the
DaemonSet): every agent fetches every other agent's ``/healthz`` by pod IP (across the nodes'
bridges, both ways), and the extender's permit Service by its DNS name (the cluster DNS from
every node, kube-proxy's Service rules for every node's pods). Then the deployment: both
extender replicas Ready on two nodes (the required anti-affinity met), the budget counting the
standby as healthy (one may go), and one agent per node.
"""

from __future__ import annotations

import json

import pytest

from tests.node.harness import Node, Obj

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(300)]

NS = "vm-autoscaling"
AGENT = "app.kubernetes.io/name=autoscaler-agent"
EXTENDER = "app.kubernetes.io/name=scheduler-extender"
PERMITS = "scheduler-extender.vm-autoscaling.svc"

# Run in an agent pod: GET each URL, print "<status> <url>" (or the error) per line.
FETCH = """
import socket, sys, urllib.request
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            print(r.status, url)
    except Exception as e:
        print("ERR", url, type(e).__name__, e)
print("DNS", socket.gethostbyname(sys.argv[-1].split("/")[2].split(":")[0]))
"""


def _pods(node: Node, selector: str) -> list[Obj]:
    out = node.kubectl("-n", NS, "get", "pods", "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def test_pods_on_every_node_reach_each_other_the_services_and_the_dns(deployed: Node) -> None:
    agents = {p["spec"]["nodeName"]: p for p in _pods(deployed, AGENT)}
    assert set(agents) == set(deployed.members), agents.keys()
    for here, pod in agents.items():
        urls = [
            f"http://{other['status']['podIP']}:10301/healthz"
            for there, other in agents.items()
            if there != here
        ]
        urls.append(f"http://{PERMITS}:10299/healthz")  # by name: the cluster DNS, a Service
        out = deployed.kubectl(
            "-n", NS, "exec", pod["metadata"]["name"], "--", "python", "-c", FETCH, *urls
        ).stdout  # fmt: skip
        print(f"from the agent on {here}:\n{out}")
        lines = out.splitlines()
        assert [line.split()[0] for line in lines[:-1]] == ["200"] * len(urls), out
        service_ip = deployed.kubectl(
            "-n", NS, "get", "service", "scheduler-extender", "-o", "jsonpath={.spec.clusterIP}"
        ).stdout
        assert lines[-1] == f"DNS {service_ip}", out


def test_the_extender_replicas_run_on_two_nodes_and_the_budget_counts_the_standby(
    deployed: Node,
) -> None:
    pods = _pods(deployed, EXTENDER)
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    roles = sorted(
        p["metadata"]["labels"].get("vm-autoscaling.io/extender-role", "-") for p in pods
    )
    print(f"scheduler-extender replicas on {nodes}, roles {roles}")
    assert len(pods) == 2 and len(set(nodes)) == 2, nodes
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert roles.count("leader") == 1, roles
    pdb = json.loads(
        deployed.kubectl("-n", NS, "get", "pdb", "scheduler-extender", "-o", "json").stdout
    )["status"]
    print(f"PodDisruptionBudget status: {pdb}")
    # minAvailable 1 of 2 healthy: the standby counts, so one (either) may be evicted.
    assert pdb["currentHealthy"] == 2 and pdb["disruptionsAllowed"] == 1, pdb
