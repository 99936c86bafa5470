"""The tier's cluster DNS: a small resolver over the API, on the node's address.

A cluster without DNS is not what users deploy onto: ``manifests/config/agent.yaml`` names the
extender ``scheduler-extender.vm-autoscaling.svc``, the example VM's metrics URL names its pod
``pg-vm.pg-vm.default.svc``. Debian has no CoreDNS, so the harness answers those names itself,
from the API server, the way the Kubernetes DNS specification says
(https://github.com/kubernetes/dns/blob/master/docs/specification.md):

- ``<service>.<ns>.svc.<zone>``: A = the Service's ClusterIP; for a headless Service the
  addresses of its EndpointSlices' endpoints (ready ones, or all when the Service publishes
  not-ready addresses: that is what the EndpointSlice controller puts in them);
- ``<hostname>.<service>.<ns>.svc.<zone>``: A = the endpoint with that ``hostname`` (a pod
  whose ``hostname`` and ``subdomain`` name it and the headless Service: a VirtualMachine's
  pod, a StatefulSet's);
- anything else in the zone: NXDOMAIN; outside it: REFUSED (pods here need nothing outside).

The kubelet's ``clusterDNS`` points pods at it, with the usual search path
``<ns>.svc.<zone> svc.<zone> <zone>`` and ``ndots:5``, so the manifests stay exactly what a user
applies. A only (AAAA gets an empty answer), UDP only (glibc's resolver asks over UDP and every
answer here fits in 512 bytes).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Any, Final

ZONE: Final = "cluster.local"
TYPE_A: Final = 1
CLASS_IN: Final = 1
NOERROR, NXDOMAIN, REFUSED, FORMERR = 0, 3, 5, 1
TTL: Final = 5

Getter = Callable[[str], dict[str, Any] | None]


def _read_name(packet: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    while True:
        length = packet[offset]
        offset += 1
        if length == 0:
            return ".".join(labels), offset
        if length & 0xC0:
            raise ValueError("compressed names do not appear in questions")
        labels.append(packet[offset : offset + length].decode("ascii").lower())
        offset += length


def resolve(name: str, get: Getter) -> list[str] | None:
    """The A records of ``name`` (None: the name does not exist)."""
    name = name.rstrip(".")
    if not name.endswith("." + ZONE):
        return None
    labels = name[: -len(ZONE) - 1].split(".")
    if len(labels) < 3 or labels[-1] != "svc":
        return None
    namespace, service = labels[-2], labels[-3]
    host = labels[-4] if len(labels) == 4 else None
    if len(labels) > 4:
        return None
    svc = get(f"/api/v1/namespaces/{namespace}/services/{service}")
    if svc is None:
        return None
    cluster_ip = svc["spec"].get("clusterIP")
    if host is None and cluster_ip and cluster_ip != "None":
        return [cluster_ip]
    slices = get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name={service}"
    )
    publish_all = bool(svc["spec"].get("publishNotReadyAddresses"))
    found = []
    for eps in (slices or {}).get("items", []):
        for endpoint in eps.get("endpoints") or []:
            ready = (endpoint.get("conditions") or {}).get("ready", True)
            if not (ready or publish_all):
                continue
            if host is None or endpoint.get("hostname") == host:
                found += endpoint.get("addresses", [])
    if host is not None and not found:
        return None
    return found


def answer(query: bytes, get: Getter) -> bytes:
    (ident, flags, qdcount) = struct.unpack("!HHH", query[:6])
    try:
        if qdcount != 1:
            raise ValueError("one question per query")
        name, end = _read_name(query, 12)
        qtype, qclass = struct.unpack("!HH", query[end : end + 4])
    except (ValueError, struct.error, IndexError, UnicodeDecodeError):
        return struct.pack("!HHHHHH", ident, 0x8000 | FORMERR, 0, 0, 0, 0)
    question = query[12 : end + 4]
    rd = flags & 0x0100
    addresses = resolve(name, get)
    if addresses is None:
        rcode = REFUSED if not name.rstrip(".").endswith(ZONE) else NXDOMAIN
        records: list[bytes] = []
    else:
        rcode = NOERROR
        records = [
            b"\xc0\x0c" + struct.pack("!HHIH", TYPE_A, CLASS_IN, TTL, 4) + IPv4Address(a).packed
            for a in addresses
            if qtype == TYPE_A and qclass == CLASS_IN
        ]
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | rcode, 1, len(records), 0, 0)
    return header + question + b"".join(records)


class ClusterDns:
    """``answer`` served on ``(address, 53)`` by a daemon thread until ``close()``."""

    def __init__(
        self, address: str, get: Getter, port: int = 53, on_close: Callable[[], None] = lambda: None
    ) -> None:
        self.address = address
        self._on_close = on_close
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((address, port))
        self._get = get
        self._closed = threading.Event()
        threading.Thread(target=self._serve, name="cluster-dns", daemon=True).start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                query, peer = self._sock.recvfrom(512)
            except OSError:
                return
            try:
                self._sock.sendto(answer(query, self._get), peer)
            except Exception:  # a bad packet or an API hiccup must not stop the resolver
                continue

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._on_close()
