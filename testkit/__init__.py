"""What the tests and the benchmarks share: the test kit.

- ``kube_api``: the fake API server (real HTTP, the v1.36 answers of tests/reference);
- ``controlplane``: the real etcd, kube-apiserver and kube-scheduler harness, with the
  extender as a process (``$VMA_KUBE_BIN``);
- ``local_stack``: the real binaries of one machine (QEMU guests, node_exporter, PostgreSQL,
  the extender and the agent) as the local bench and the end-to-end tests start them;
- ``memory_workloads``: page-cache and kernel-memory workloads for a guest under the agent;
- ``manifests``: the deployment files read as ``kubectl apply -k`` would;
- ``agent_fakes``: the agent's fake extender, hypervisors and guest metrics;
- ``ports``: a free loopback port;
- ``bench``: the benchmarks' kit (their command shape and exit statuses, the one percentile
  rule, CPU pinning, JSON output in snake_case); ``procfs``: a process's CPU time and memory;
  ``recommender_snapshot``: the recommender's benchmark snapshot; ``cpu_profile``: cProfile by
  CPU time (``python -m testkit.cpu_profile``).

Tests (``tests/``) and benchmarks (``scripts/``) import from here: it is installed with the
project (pyproject.toml), so no script edits ``sys.path``. It imports from neither, and the
product imports nothing of it (import-linter contracts in pyproject.toml).
"""
