"""The local bench's verdict over several bursts: pure, from samples written as data.

The bench itself runs end to end in tests/e2e/test_local_bench.py; this pins the judging of
what the e2e run rarely shows: a burst that did not shrink, and a QEMU that died mid-run.
"""

from __future__ import annotations

from scripts.local_bench import Sample, judge

LATENCY = [(1.0, 1.0), (2.5, 2.0), (float("inf"), 2.0)]


def sample(t: float, phase: str, burst: int, vcpus: int, *, online: int | None = None) -> Sample:
    return Sample(
        t=t, phase=phase, burst=burst, vcpus=vcpus, online=online or vcpus,
        reserved_before=vcpus, reserved_after=vcpus, agent_desired=vcpus, node_free_cpu=0.0,
        tps=100.0 * vcpus if phase == "load" else None, stuck=0,
    )  # fmt: skip


def cycle(burst: int, start: float) -> list[Sample]:
    """Load from ``start`` to ``start + 3``: 1, 3, 3 vCPUs; then cool: 3, 1."""
    return [
        sample(start, "load", burst, 1),
        sample(start + 1, "load", burst, 3),
        sample(start + 2, "load", burst, 3),
        sample(start + 4, "cool", burst, 3),
        sample(start + 6, "cool", burst, 1),
    ]


def test_two_full_cycles_survived():
    samples = [sample(0, "idle", 0, 1), *cycle(1, 1), *cycle(2, 10)]
    verdict = judge(samples, min_vcpus=1, loads=[(1, 4), (10, 13)], bursts_planned=2,
                    is_vm_alive=True, latency=LATENCY)  # fmt: skip
    assert [b.grew_to for b in verdict.bursts] == [3, 3]
    assert [b.grow_seconds for b in verdict.bursts] == [1, 1]
    assert [b.shrink_seconds for b in verdict.bursts] == [3, 3]
    assert verdict.bursts[0].tps_by_vcpus == {1: 100.0, 3: 300.0}
    assert (verdict.cycles_survived, verdict.ok) == (2, True)
    line = verdict.line("default/pg-vm-0")
    assert "burst 1: grew to 3 in 1.0s, tps 100->300" in line
    assert "burst 2: grew to 3 in 1.0s" in line
    assert "cycles survived 2/2;" in line
    assert "(n=2)" in line


def test_qemu_dying_in_the_second_burst_fails_the_verdict():
    # The hot-plug mode on QEMU 7.2 under TCG: the second grow kills QEMU mid-load.
    samples = [sample(0, "idle", 0, 1), *cycle(1, 1), sample(10, "load", 2, 1)]
    verdict = judge(samples, min_vcpus=1, loads=[(1, 4), (10, 10)], bursts_planned=2,
                    is_vm_alive=False, latency=LATENCY)  # fmt: skip
    assert (verdict.cycles_survived, verdict.ok) == (1, False)
    assert "DID NOT GROW" in verdict.line("vm")
    assert "cycles survived 1/2, QEMU DIED" in verdict.line("vm")


def test_a_burst_that_did_not_shrink_ends_the_count():
    stuck = [sample(1, "load", 1, 1), sample(2, "load", 1, 3), sample(5, "cool", 1, 3)]
    samples = [sample(0, "idle", 0, 1), *stuck, *cycle(2, 10)]
    verdict = judge(samples, min_vcpus=1, loads=[(1, 4), (10, 13)], bursts_planned=2,
                    is_vm_alive=True, latency=[])  # fmt: skip
    assert verdict.bursts[0].shrink_seconds is None
    assert (verdict.cycles_survived, verdict.ok) == (0, False)
    assert "DID NOT SHRINK" in verdict.line("vm")
    assert "p50 - p99 -" in verdict.line("vm")
