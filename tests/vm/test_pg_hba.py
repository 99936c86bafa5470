"""The guests' PostgreSQL admits, by password, every client the pod network can send.

QEMU user networking (libslirp, ``sotranslate_accept`` in src/socket.c) rewrites a forwarded
connection's source to the host alias 10.0.2.2 only when it came from loopback or an unspecified
address; any other peer keeps its own address. On a node that is a pod's IP, the CNI bridge's
gateway (10.88.0.1 with the bridge plugin, seen by the first node run) or a node IP after
kube-proxy's masquerade: nothing the guest can know in advance. So the guests admit every
address, with scram-sha-256, and leave reachability to the pod's network (NetworkPolicy).
"""

from __future__ import annotations

import ipaddress
import re

from hypothesis import given
from hypothesis import strategies as st

from tests.vm.conftest import REPO

GUEST = REPO / "vm_image" / "guest"
SCRIPTS = (GUEST / "postgres-guest", GUEST / "full-setup.sh")
PASSWORD_METHODS = {"scram-sha-256", "md5"}
SLIRP_HOST = ipaddress.ip_address("10.0.2.2")


def _host_lines(script: str) -> list[list[str]]:
    """The ``host`` records the script appends to pg_hba.conf."""
    return [
        m[1].split()
        for m in re.finditer(r"""echo ['"](host\s[^'"]+)['"]\s*>>[^\n]*pg_hba""", script)
    ]


def _admits_by_password(records: list[list[str]], peer: ipaddress.IPv4Address) -> bool:
    for kind, database, user, address, method, *_ in records:
        if kind == "host" and ipaddress.ip_address(peer) in ipaddress.ip_network(address):
            # The first matching record decides, as PostgreSQL reads pg_hba.conf.
            return database == "all" and user == "all" and method in PASSWORD_METHODS
    return False


def _as_guest_sees(peer: ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    return SLIRP_HOST if peer.is_loopback or peer.is_unspecified else peer


def test_the_scripts_write_host_records():
    for script in SCRIPTS:
        assert _host_lines(script.read_text()), script


@given(st.ip_addresses(v=4))
def test_any_client_of_the_forward_is_admitted_by_password(peer):
    for script in SCRIPTS:
        records = _host_lines(script.read_text())
        assert _admits_by_password(records, _as_guest_sees(peer)), (script.name, str(peer))


def test_the_first_node_s_bridge_gateway_is_admitted():
    """`no pg_hba.conf entry for host "10.88.0.1"` refused pgbench on the first real node."""
    for script in SCRIPTS:
        records = _host_lines(script.read_text())
        assert _admits_by_password(records, ipaddress.ip_address("10.88.0.1"))
