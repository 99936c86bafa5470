"""The tier's cluster DNS answers the names the manifests use, from API objects.

Pure and fast (no node): the answers are decoded here independently of the encoder. On the node
the real glibc resolver in the agent's pod uses it (tests/node/test_deploy.py).
"""

from __future__ import annotations

import struct
from ipaddress import IPv4Address
from typing import Any

from tests.node.dns import NOERROR, NXDOMAIN, REFUSED, answer, resolve

SERVICES: dict[str, Any] = {
    "/api/v1/namespaces/vm-autoscaling/services/scheduler-extender": {
        "spec": {"clusterIP": "10.0.0.17"}
    },
    "/api/v1/namespaces/default/services/pg-vm": {
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True}
    },
    "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    "?labelSelector=kubernetes.io/service-name=pg-vm": {
        "items": [
            {
                "endpoints": [
                    {"addresses": ["10.88.0.4"], "hostname": "pg-vm-0",
                     "conditions": {"ready": False}},
                    {"addresses": ["10.88.0.9"], "hostname": "pg-vm-1",
                     "conditions": {"ready": True}},
                ]
            }
        ]
    },
}  # fmt: skip


def get(path: str) -> Any:
    return SERVICES.get(path)


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def decode(reply: bytes) -> tuple[int, int, list[str]]:
    ident, flags, qd, an, _, _ = struct.unpack("!HHHHHH", reply[:12])
    assert flags & 0x8000 and qd == 1
    pos = 12
    while reply[pos]:
        pos += reply[pos] + 1
    pos += 5
    addresses = []
    for _ in range(an):
        pointer, rtype, rclass, _ttl, length = struct.unpack("!HHHIH", reply[pos : pos + 12])
        assert (pointer, rtype, rclass, length) == (0xC00C, 1, 1, 4)
        addresses.append(str(IPv4Address(reply[pos + 12 : pos + 16])))
        pos += 16
    assert pos == len(reply)
    return ident, flags & 0xF, addresses


def test_a_service_name_is_its_cluster_ip() -> None:
    reply = answer(query("scheduler-extender.vm-autoscaling.svc.cluster.local"), get)
    assert decode(reply) == (0x1234, NOERROR, ["10.0.0.17"])


def test_a_statefulset_pod_is_found_through_its_headless_service_even_not_ready() -> None:
    reply = answer(query("pg-vm-0.pg-vm.default.svc.cluster.local"), get)
    assert decode(reply)[1:] == (NOERROR, ["10.88.0.4"])
    assert resolve("pg-vm.default.svc.cluster.local", get) == ["10.88.0.4", "10.88.0.9"]


def test_unknown_names_do_not_exist_and_other_zones_are_refused() -> None:
    # The search path makes glibc try these first: they must fail fast, not time out.
    assert decode(answer(query("scheduler-extender.vm-autoscaling.svc.vm-autoscaling.svc"
                               ".cluster.local"), get))[1] == NXDOMAIN  # fmt: skip
    assert decode(answer(query("pg-vm-7.pg-vm.default.svc.cluster.local"), get))[1] == NXDOMAIN
    assert decode(answer(query("deb.debian.org"), get))[1] == REFUSED


def test_aaaa_gets_an_empty_answer_for_a_known_name() -> None:
    reply = answer(query("scheduler-extender.vm-autoscaling.svc.cluster.local", qtype=28), get)
    assert decode(reply)[1:] == (NOERROR, [])


def test_garbage_is_a_format_error_not_a_crash() -> None:
    assert answer(b"\x00\x01\x00\x00\x00\x02" + b"\x00" * 6, get)[3] & 0xF == 1
