"""Moved to ``testkit.manifests`` (the test kit, which the benchmarks share): import from there.

This old name is kept only for tests written before the move; delete it once none imports it.
"""

from testkit.manifests import *  # noqa: F403
