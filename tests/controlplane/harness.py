"""Moved to ``testkit.controlplane`` (the test kit, which the benchmarks share): import from there.

This old name is kept only for tests written before the move; delete it once none imports it.
"""

from testkit.controlplane import *  # noqa: F403
