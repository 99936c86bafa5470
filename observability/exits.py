"""How every vm-autoscaling command ends when it cannot run: one line on stderr, one exit code.

An operator's mistake (a bad flag, a missing file, a kubeconfig that does not load, a port
someone else holds) is not a bug: it gets one line that names the thing to fix, never a
traceback, and an exit code of its own, so a script or a crash-looping pod's status tells the
classes apart. Both services and the offline tools share these numbers; each ``--help`` ends
with ``EXIT_CODES_HELP``.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import NoReturn, TextIO


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    """An unexpected fault (a bug: logged with its traceback), or a broken simulated invariant."""
    USAGE = 2
    """Bad command line: unknown flag, missing argument (argparse's convention)."""
    CONFIG = 3
    """A file named on the command line is missing, unreadable, not YAML or not valid."""
    KUBECONFIG = 4
    """The kubeconfig is missing, does not load, or its credentials are refused."""
    NOT_IN_CLUSTER = 5
    """No --kubeconfig and no in-cluster service account (not running in a pod)."""
    API_UNREACHABLE = 6
    """The API server does not answer (wrong address, down, a firewall)."""
    PORT_IN_USE = 7
    """A listen address is taken by another process (or may not be bound by this user)."""


EXIT_CODES_HELP = """\
exit status:
  0  stopped cleanly (SIGTERM/SIGINT) or finished
  1  unexpected fault (logged with a traceback), or a simulation's invariant broke
  2  bad command line (unknown flag, missing argument)
  3  a file you named is missing, unreadable, not YAML or invalid (the line names it)
  4  the kubeconfig is missing or does not load, or the API server refused its credentials
  5  no --kubeconfig and not running in a pod (no in-cluster service account)
  6  the API server did not answer
  7  a listen address is in use (or may not be bound)
"""


class Problem(Exception):
    """A service cannot start for a reason its operator fixes (``kube_io.preflight`` raises
    these for kubeconfigs and API servers): ``str(self)`` is the line, ``code`` the exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


def fail(prog: str, message: str, code: ExitCode, *, stream: TextIO | None = None) -> int:
    """Print ``prog: message`` as one line on stderr and return ``code`` for ``sys.exit``."""
    one_line = " ".join(message.split())
    print(f"{prog}: {one_line}", file=stream if stream is not None else sys.stderr)
    return int(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (plus where to look), exit 2.

    Subparsers made through ``add_subparsers`` are of the same class, so they behave alike.
    """

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see {self.prog} --help)", ExitCode.USAGE)
        sys.exit(ExitCode.USAGE)
