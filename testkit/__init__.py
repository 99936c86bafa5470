"""What the tests and the benchmarks share: the test kit.

- ``kube_api``: the fake API server (real HTTP, the v1.36 answers of tests/reference);
- ``controlplane``: the real etcd, kube-apiserver and kube-scheduler harness, with the
  extender as a process (``$VMA_KUBE_BIN``);
- ``local_stack``: the real binaries of one machine (QEMU guests, node_exporter, PostgreSQL,
  the extender and the agent) as the local bench and the end-to-end tests start them;
- ``memory_workloads``: page-cache and kernel-memory workloads for a guest under the agent;
- ``manifests``: the deployment files read as ``kubectl apply -k`` would;
- ``agent_fakes``: the agent's fake extender, hypervisors and guest metrics;
- ``ports``: a free loopback port.

Tests (``tests/``) and benchmarks (``scripts/``) import from here; this package imports from
neither, and the product imports nothing of it (import-linter contracts in pyproject.toml).
"""
