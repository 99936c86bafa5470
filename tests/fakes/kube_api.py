"""Moved to ``testkit.kube_api`` (the test kit, which the benchmarks share): import from there.

This old name is kept only for tests written before the move; delete it once none imports it.
"""

from testkit.kube_api import *  # noqa: F403
