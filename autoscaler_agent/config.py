"""The agent's configuration: one YAML file to a frozen, typed tree.

Shell (reads one file). Unknown keys are errors (a typo must not silently become a default),
and every error names its location as msgspec reports it, e.g.
``Expected `float` > 0.0, got `0` - at `$.scrape.interval_seconds```. Cross-field rules live in
``__post_init__``; msgspec turns their ValueError into the same kind of message with the path.
``__main__`` exits with status 3 on any ``ConfigError``.

Every key and its default (all optional; an empty file is a valid config)::

    scrape:
      interval_seconds: 1.0          # how often each VM's node_exporter is read
      timeout_seconds: 0.8           # a slower scrape counts as failed
      keep_goal_seconds: 3.0         # after a failed scrape the VM keeps its last decision
                                     # (goal, windows, permit asked) while its last good scrape
                                     # is at most this old; past it, it holds its current size
      cgroup_root: null              # the host's cgroup filesystem (mounted read-only in the
                                     # agent's pod): each scrape also reads the VM container's
                                     # CPU throttling (cpu.stat) below it; null: not read
    policy:
      target_load_per_vcpu: 0.9      # demand (runnable tasks) one vCPU should carry; grow to
                                     # ceil(demand / this) (formula: autoscaler_agent/policy.py)
      shrink_load_per_vcpu: 0.6      # sizes a shrink; must be below the target (no flapping)
      shrink_after_seconds: 30.0     # how long the load must stay low before shrinking
      saturated_busy_fraction: 0.9   # busy fraction (0..1, over one scrape interval) from
                                     # which the VM counts as saturated and the run queue
                                     # (node_procs_running) is read to size the grow
      throttled_fraction: 0.1        # ... or from this share of CFS periods in which the VM
                                     # container was throttled (demand hidden by its quota)
      steal_fraction: 0.1            # ... or from this share of CPU time stolen from the guest
      grow_after_seconds: 3.0        # how long the fast demand estimate must need more vCPUs
                                     # before growing (0: on the first such scrape)
    memory:                          # VMs with a virtio-mem device (max-memory > min-memory);
                                     # formula: autoscaler_agent/memory_policy.py
      low_headroom_fraction: 0.2     # grow when MemAvailable (projected) is below this share
                                     # of the guest's use (MemTotal - MemAvailable) ...
      target_headroom_fraction: 0.5  # ... to leave this share; a shrink leaves it too
      min_headroom_bytes: 134217728  # headroom is never less than this (128 MiB)
      lookahead_seconds: 3.0         # a rising use (a trend) is projected this far ahead
      trend_min_fraction: 0.06       # a rise per scrape above this share of the use is a trend
      shrink_after_seconds: 30.0     # how long memory must stay over-sized before shrinking
      memory_per_vcpu_bytes: 0       # couple vCPUs and memory (e.g. 4294967296: 1 vCPU per
                                     # 4 GiB, compute-unit style); 0 = decided separately
      pressure_fraction: 0.1         # grow when some task waited for memory (PSI some) for
                                     # more than this share of the last scrape interval ...
      pressure_grow_fraction: 0.25   # ... by this share of the VM's size (at least a unit)
      guest_signals: true            # read the guest's memory-pressure port (QEMU VMs with
                                     # memory hot-plug) and scrape at once when it signals ...
      signal_min_interval_seconds: 0.2  # ... but no sooner than this after the last scrape
    extender:
      url: http://127.0.0.1:10299    # the extender's permit port
      token_file: null               # bearer token (projected SA token); null sends none
      timeout_seconds: 2.0           # per batch; slower counts as unavailable
      batch_window_seconds: 0.005    # requests arriving this close together share a POST
      permit_retry_seconds: 5.0      # after a denied/partial grant, ask again this much later
      epoch_check_seconds: 5.0       # idle this long: send an empty batch to learn the
                                     # extender's epoch (after its restart, VMs report)
    retry:
      backoff_initial_seconds: 0.5   # extender/hypervisor failures: initial * 2**(n-1) ...
      backoff_max_seconds: 30.0      # ... capped here ...
      jitter_fraction: 0.5           # ... and shortened by up to this fraction at random
      resize_failure_hold_seconds: 60.0  # after a resize error that retrying will not fix
    hypervisor:
      socket_root: /                 # host paths in `hypervisor` URLs are below this
      timeout_seconds: 5.0           # per hypervisor call
      unplug_timeout_seconds: 10.0   # how long a QEMU vCPU shrink waits for the guest
      memory_stall_seconds: 3.0      # a QEMU memory resize ends when the guest's plugged size
                                     # has not moved this long (a shrink of memory in use) ...
      memory_resize_timeout_seconds: 60.0  # ... or after this long in all
    http:
      host: 0.0.0.0                  # /healthz and /metrics
      port: 10301
    metrics:
      stuck_after_seconds: 60.0      # a wanted size change pending this long (permit denied,
                                     # hypervisor refusing, vCPUs not online in the guest)
                                     # sets vmautoscale_agent_vm_stuck to 1 for the VM (and
                                     # vmautoscale_agent_vm_memory_stuck for memory)
    log:
      level: info                    # debug logs every tick
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

from autoscaler_agent.core import CoreConfig
from autoscaler_agent.memory_policy import MemoryPolicyConfig
from autoscaler_agent.policy import PolicyConfig
from protocol import bounds
from protocol.bounds import Bytes, PositiveSeconds
from protocol.strict_yaml import describe_yaml_error

Seconds = PositiveSeconds
NonNegativeSeconds = bounds.Seconds
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
# Headroom is a share of what the guest uses, and may be larger than all of it.
Headroom = Annotated[float, msgspec.Meta(ge=0, le=100)]
LoadPerVcpu = Annotated[float, msgspec.Meta(gt=0, le=bounds.MAX_VCPUS)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ScrapeSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    interval_seconds: Seconds = 1.0
    timeout_seconds: Seconds = 0.8
    keep_goal_seconds: NonNegativeSeconds = 3.0
    cgroup_root: str | None = None


class PolicySection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    target_load_per_vcpu: LoadPerVcpu = 0.9
    shrink_load_per_vcpu: LoadPerVcpu = 0.6
    shrink_after_seconds: NonNegativeSeconds = 30.0
    saturated_busy_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.9
    grow_after_seconds: NonNegativeSeconds = 3.0
    throttled_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.1
    steal_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.1

    def __post_init__(self) -> None:
        if self.shrink_load_per_vcpu >= self.target_load_per_vcpu:
            raise ValueError(
                f"shrink_load_per_vcpu ({self.shrink_load_per_vcpu}) must be below"
                f" target_load_per_vcpu ({self.target_load_per_vcpu}), or a VM would shrink"
                " into a size that immediately asks to grow again"
            )


class MemorySection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    low_headroom_fraction: Headroom = 0.2
    target_headroom_fraction: Headroom = 0.5
    min_headroom_bytes: Bytes = 128 * 2**20
    lookahead_seconds: NonNegativeSeconds = 3.0
    trend_min_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.06
    shrink_after_seconds: NonNegativeSeconds = 30.0
    memory_per_vcpu_bytes: Bytes = 0
    pressure_fraction: Fraction = 0.1
    pressure_grow_fraction: Headroom = 0.25
    guest_signals: bool = True
    signal_min_interval_seconds: NonNegativeSeconds = 0.2

    def __post_init__(self) -> None:
        if self.target_headroom_fraction <= self.low_headroom_fraction:
            raise ValueError(
                f"target_headroom_fraction ({self.target_headroom_fraction}) must be above"
                f" low_headroom_fraction ({self.low_headroom_fraction}), or a VM would grow"
                " to a size that asks to grow again"
            )


class ExtenderSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str = "http://127.0.0.1:10299"
    token_file: str | None = None
    timeout_seconds: Seconds = 2.0
    batch_window_seconds: NonNegativeSeconds = 0.005
    permit_retry_seconds: Seconds = 5.0
    # With nothing to ask for this long, send an empty batch to learn the extender's epoch:
    # after an extender restart this node's VMs report within about this long.
    epoch_check_seconds: Seconds = 5.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")


class RetrySection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    backoff_initial_seconds: Seconds = 0.5
    backoff_max_seconds: Seconds = 30.0
    jitter_fraction: Fraction = 0.5
    resize_failure_hold_seconds: Seconds = 60.0

    def __post_init__(self) -> None:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_initial_seconds")


class HypervisorSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    socket_root: str = "/"
    timeout_seconds: Seconds = 5.0
    unplug_timeout_seconds: Seconds = 10.0
    memory_stall_seconds: Seconds = 3.0
    memory_resize_timeout_seconds: Seconds = 60.0


class HttpSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "0.0.0.0"
    port: Port = 10301


class MetricsSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    stuck_after_seconds: Seconds = 60.0


class LogSection(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Section, frozen=True, kw_only=True, forbid_unknown_fields=True):
    scrape: ScrapeSection = msgspec.field(default_factory=ScrapeSection)
    policy: PolicySection = msgspec.field(default_factory=PolicySection)
    memory: MemorySection = msgspec.field(default_factory=MemorySection)
    extender: ExtenderSection = msgspec.field(default_factory=ExtenderSection)
    retry: RetrySection = msgspec.field(default_factory=RetrySection)
    hypervisor: HypervisorSection = msgspec.field(default_factory=HypervisorSection)
    http: HttpSection = msgspec.field(default_factory=HttpSection)
    metrics: MetricsSection = msgspec.field(default_factory=MetricsSection)
    log: LogSection = msgspec.field(default_factory=LogSection)

    def core(self) -> CoreConfig:
        """The slice of the config the pure core needs."""
        return CoreConfig(
            scrape_interval_seconds=self.scrape.interval_seconds,
            scrape_keep_goal_seconds=self.scrape.keep_goal_seconds,
            policy=PolicyConfig(
                target_load_per_vcpu=self.policy.target_load_per_vcpu,
                shrink_load_per_vcpu=self.policy.shrink_load_per_vcpu,
                shrink_after_seconds=self.policy.shrink_after_seconds,
                saturated_busy_fraction=self.policy.saturated_busy_fraction,
                grow_after_seconds=self.policy.grow_after_seconds,
                throttled_fraction=self.policy.throttled_fraction,
                steal_fraction=self.policy.steal_fraction,
            ),
            permit_retry_seconds=self.extender.permit_retry_seconds,
            backoff_initial_seconds=self.retry.backoff_initial_seconds,
            backoff_max_seconds=self.retry.backoff_max_seconds,
            backoff_jitter_fraction=self.retry.jitter_fraction,
            resize_failure_hold_seconds=self.retry.resize_failure_hold_seconds,
            memory_signal_min_interval_seconds=self.memory.signal_min_interval_seconds,
            memory=MemoryPolicyConfig(
                low_headroom_fraction=self.memory.low_headroom_fraction,
                target_headroom_fraction=self.memory.target_headroom_fraction,
                min_headroom_bytes=self.memory.min_headroom_bytes,
                lookahead_seconds=self.memory.lookahead_seconds,
                trend_min_fraction=self.memory.trend_min_fraction,
                shrink_after_seconds=self.memory.shrink_after_seconds,
                memory_per_vcpu_bytes=self.memory.memory_per_vcpu_bytes,
                pressure_fraction=self.memory.pressure_fraction,
                pressure_grow_fraction=self.memory.pressure_grow_fraction,
            ),
        )


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the ``$.path``."""


def parse_config(text: str, *, source: str = "<config>") -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {describe_yaml_error(e)}") from e
    if raw is None:
        raw = {}
    try:
        return msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {e}") from e


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from e
    return parse_config(text, source=str(path))
