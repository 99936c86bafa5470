"""The run-bench's samples, its live table's rows and its plot: one look for both paths.

``scripts/local_bench.py`` (``run-bench.sh --local``) and ``scripts/cluster_bench.py`` (the
cluster path's sampler) take the same ``Sample`` each second, print the same ``row`` and draw the
same ``plot``; only where the numbers come from differs (``setting`` names it in the title).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sample:
    t: float  # seconds since the bench started sampling
    phase: str  # idle, load, cool
    burst: int  # 0 while idle, then 1, 2, ... for each load and the cool-down after it
    # The VM's size as its hypervisor reports it: vCPUs plugged into QEMU (QMP query-cpus-fast)
    # in the hot-plug mode; in the online mode (QEMU keeps all of them) the vCPUs the guest has
    # online per qemu-guest-agent, as the agent last read them (it holds the QGA socket).
    vcpus: int | None
    online: float | None  # online in the guest (its node_exporter, as the agent last read it)
    # The VM's reservation (its permit) in the extender's ledger, read just before and just
    # after the vCPUs: a grow raises it before plugging, a shrink lowers it after unplugging.
    reserved_before: float | None
    reserved_after: float | None
    agent_desired: float | None
    node_free_cpu: float | None
    tps: float | None
    stuck: float | None  # vmautoscale_agent_vm_stuck


HEADER = f"{'t (s)':>6}  {'phase':<5}  {'vCPUs':>5}  {'online':>6}  {'permit':>6}  {'wants':>5}  {'node free':>9}  {'tps':>7}  {'stuck':>5}"  # noqa: E501


def row(s: Sample) -> str:
    def f(v: float | None, width: int, digits: int = 0) -> str:
        return f"{'-' if v is None else f'{v:.{digits}f}':>{width}}"

    return (
        f"{s.t:>6.0f}  {s.phase:<5}  {f(s.vcpus, 5)}  {f(s.online, 6)}  {f(s.reserved_after, 6)}  "
        f"{f(s.agent_desired, 5)}  {f(s.node_free_cpu, 9, 1)}  {f(s.tps, 7)}  {f(s.stuck, 5)}"
    )


def plot(
    samples: list[Sample],
    path: Path,
    *,
    vm: str,
    vcpu_mode: str,
    setting: str = "local run-bench",
    client: str = "host client",
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 7))
    size_label = (
        "vCPUs set online (QGA, as the agent read it)" if vcpu_mode == "online"
        else "vCPUs plugged (QMP)"
    )  # fmt: skip
    top.step(t, [s.vcpus for s in samples], where="post", label=size_label, linewidth=2.5)
    top.step(t, [s.online for s in samples], where="post", label="vCPUs online in the guest",
             linewidth=1.5, color="tab:purple")  # fmt: skip
    top.step(t, [s.reserved_after for s in samples], where="post", linestyle="--",
             label="permit (extender ledger)", color="tab:red")  # fmt: skip
    top.step(t, [s.agent_desired for s in samples], where="post", linestyle=":",
             label="wanted (agent)", color="tab:gray")  # fmt: skip
    top.step(t, [s.node_free_cpu for s in samples], where="post", linestyle="-.",
             label="node free CPU (extender)", color="tab:brown")  # fmt: skip
    top.set_ylabel("vCPUs / CPUs")
    top.set_title(f"{vm}: pgbench against PostgreSQL in the VM ({setting})")
    bottom.plot(t, [s.tps for s in samples], label=f"pgbench tps ({client}, guest server)",
                color="tab:green")  # fmt: skip
    stuck = [s.t for s in samples if s.stuck]
    if stuck:
        bottom.scatter(stuck, [0] * len(stuck), marker="x", color="tab:red",
                       label="agent: VM stuck")  # fmt: skip
    bottom.set_ylabel("tps")
    bottom.set_xlabel("seconds")
    for burst in sorted({s.burst for s in samples if s.phase == "load"}):
        loaded = [s.t for s in samples if s.phase == "load" and s.burst == burst]
        for axis in (top, bottom):
            axis.axvspan(loaded[0], loaded[-1], alpha=0.12, color="tab:orange",
                         label="pgbench running" if burst == 1 else None)  # fmt: skip
    top.legend(loc="upper left", fontsize="small")
    bottom.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
