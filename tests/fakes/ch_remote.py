#!/usr/bin/env python3
"""A stand-in for cloud-hypervisor's ``ch-remote`` CLI: ``--api-socket PATH info|resize
[--cpus N] [--memory SIZE]``.

Speaks HTTP/1.1 to the API socket like the real one and answers like it (SOURCE.md): on 2xx it
prints the body, if any, to stdout and exits 0; on any other status it prints
``Server responded with error <status>: <body>`` to stderr and exits 1; if the socket cannot be
reached it prints the I/O error and exits 1. Standard library only, so it starts fast under
any Python 3. A test double: it implements no other subcommand and must not ship.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self._path)
        self.sock = sock


def _size(text: str) -> int:
    """Bytes, with an optional K, M or G suffix (powers of 1024), as ch-remote reads them."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ch-remote")
    parser.add_argument("--api-socket", required=True)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info")
    resize = commands.add_parser("resize")
    resize.add_argument("--cpus", type=int)
    resize.add_argument("--memory", type=_size)
    args = parser.parse_args(argv)

    if args.command == "info":
        method, endpoint, body = "GET", "vm.info", None
    else:
        method, endpoint = "PUT", "vm.resize"
        resize: dict[str, int] = {}
        if args.cpus is not None:
            resize["desired_vcpus"] = args.cpus
        if args.memory is not None:
            resize["desired_ram"] = args.memory
        body = json.dumps(resize)
    try:
        conn = _UnixConnection(args.api_socket)
        conn.request(
            method,
            f"/api/v1/{endpoint}",
            body=body,
            headers={"Accept": "*/*", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        text = response.read().decode()
    except OSError as e:
        print(f"Error opening HTTP socket: {e}", file=sys.stderr)
        return 1
    if 200 <= response.status < 300:
        if text:
            print(text)
        return 0
    print(f"Server responded with error {response.status}: {text}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
