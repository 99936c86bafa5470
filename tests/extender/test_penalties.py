"""Penalties (issue 16): an address that keeps offending has its new connections dropped by the
kernel for a while (a socket filter on the listening socket), so its flood costs the event loop
nothing; its connections already open, and every other address, go on. On the guarded
listeners only (permits, metrics): the verbs listener's one client is kube-scheduler.

Real sockets on loopback (Linux routes all of 127/8 to it: several client addresses, one
machine). A connect whose SYN the filter drops waits for the kernel's retry (1 s); one that is
let through completes inside ``connect`` on loopback, so a short timeout tells the two apart.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from scheduler_extender.http.penalties import AddressBuckets, PenaltyBox, attach, drop_program
from tests.extender.conftest import Start, wait_until

DROPPED = 0.5  # a dropped SYN's connect is still waiting after this; a kept one took ~0
WITHIN = 5.0

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def _connect(port: int, source: str, *, family: int = socket.AF_INET) -> socket.socket | None:
    """A connection from ``source``, or None when its SYN was dropped."""
    client = socket.socket(family, socket.SOCK_STREAM)
    client.settimeout(DROPPED)
    try:
        client.bind((source, 0))
        client.connect(("::1" if family == socket.AF_INET6 else "127.0.0.1", port))
    except TimeoutError:
        client.close()
        return None
    client.settimeout(WITHIN)
    return client


def _ask(client: socket.socket, request: bytes) -> bytes:
    client.sendall(request)
    return client.recv(4096)


async def test_an_offender_is_dropped_by_the_kernel_and_its_open_connections_go_on(
    listeners: Start,
) -> None:
    _, permits = await listeners(
        permits={
            "port": 1,
            "new_connections_per_second": 0.001,
            "new_connections_burst": 1,
            "offence_burst": 3,
            "offences_per_second": 0.001,
            "penalty_seconds": 1.0,
        }
    )
    port = permits.bound_port
    # The connection 127.0.0.3 opened while still in good standing (its one within the rate).
    kept = await asyncio.to_thread(_connect, port, "127.0.0.3")
    assert kept is not None
    try:
        assert (await asyncio.to_thread(_ask, kept, HEALTHZ)).startswith(b"HTTP/1.1 200 ")
        # Four connections over its rate: 503 each, offences; the fourth is one too many.
        for _ in range(4):
            assert permits.penalties.penalized == 0
            client = await asyncio.to_thread(_connect, port, "127.0.0.3")
            assert client is not None
            with client:
                answer = await asyncio.to_thread(_ask, client, HEALTHZ)
            assert answer.startswith(b"HTTP/1.1 503 "), answer
        await wait_until(lambda: permits.penalties.addresses == {"127.0.0.3"})
        assert permits.penalties.penalized == 1
        # Its new connections never get past the kernel now...
        assert await asyncio.to_thread(_connect, port, "127.0.0.3") is None
        # ...while the one it had goes on, and every other address gets in.
        assert (await asyncio.to_thread(_ask, kept, HEALTHZ)).startswith(b"HTTP/1.1 200 ")
        other = await asyncio.to_thread(_connect, port, "127.0.0.1")
        assert other is not None
        with other:
            assert (await asyncio.to_thread(_ask, other, HEALTHZ)).startswith(b"HTTP/1.1 200 ")
    finally:
        kept.close()
    # The penalty ends and the filter goes: 127.0.0.3's SYNs get through again (its rate is
    # still spent, so it is answered 503).
    await wait_until(lambda: not permits.penalties.addresses, timeout_seconds=WITHIN)
    again = await asyncio.to_thread(_connect, port, "127.0.0.3")
    assert again is not None
    again.close()


@pytest.mark.parametrize(
    ("family", "listen", "blocked", "dropped", "kept"),
    [
        # The middle one of three: every block's jumps land where they should.
        (socket.AF_INET, "127.0.0.1",
         ["127.0.0.3", "127.0.0.2", "127.0.0.4"], "127.0.0.2", "127.0.0.5"),
        (socket.AF_INET6, "::1", ["fe80::1", "::1", "2001:db8::7"], "::1", None),
        (socket.AF_INET6, "::1", ["fe80::1", "::2", "127.0.0.1"], None, "::1"),
    ],
)  # fmt: skip
def test_the_drop_filter_drops_exactly_the_addresses_given(
    family: int, listen: str, blocked: list[str], dropped: str | None, kept: str | None
) -> None:
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((listen, 0))
    except OSError:
        listener.close()
        pytest.skip(f"no {listen} on this machine")
    with listener:
        listener.listen(8)
        attach(listener, drop_program(family, blocked))
        port = listener.getsockname()[1]
        if dropped is not None:
            assert _connect(port, dropped, family=family) is None
        if kept is not None:
            client = _connect(port, kept, family=family)
            assert client is not None
            client.close()
        attach(listener, b"")  # detached: everyone gets in
        client = _connect(port, dropped or kept or listen, family=family)
        assert client is not None
        client.close()
    # Addresses of the other family make no filter at all.
    assert drop_program(socket.AF_INET6, ["127.0.0.1"]) == b""
    assert drop_program(socket.AF_INET, ["::1"]) == b""


def test_a_filter_left_on_a_handed_on_socket_is_cleared_when_a_server_takes_it() -> None:
    # The permit front's socket outlives a front that dies while an address is penalized;
    # the next front's site resets its penalties when it starts (GuardedSite.start).
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        attach(listener, drop_program(socket.AF_INET, ["127.0.0.2"]))
        assert _connect(port, "127.0.0.2") is None
        box = PenaltyBox(
            listener=lambda: "test",
            seconds=10.0,
            offences=AddressBuckets(per_second=1.0, burst=1),
            sockets=lambda: [listener],
        )
        box.reset()
        client = _connect(port, "127.0.0.2")
        assert client is not None
        client.close()
