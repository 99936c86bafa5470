"""The test processes' loopback ports: never one number twice, never one something holds."""

from __future__ import annotations

import multiprocessing
import socket

from testkit.ports import FIRST, LAST, free_port


def _draw(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


def test_processes_drawing_at_once_never_get_one_number_twice() -> None:
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        drawn = [port for ports in pool.map(_draw, [100, 100, 100]) for port in ports]
    drawn += _draw(100)
    assert len(set(drawn)) == len(drawn) == 400
    assert all(FIRST <= port <= LAST for port in drawn)


def test_a_port_something_listens_on_is_passed_over() -> None:
    first = free_port()
    with socket.create_server(("127.0.0.1", first + 1 if first < LAST else FIRST)) as held:
        taken = held.getsockname()[1]
        # The counter now stands at `first`; the next number is the held one, so it is skipped.
        assert free_port() != taken
