"""Per-namespace quotas for VM pods: the config section, and the arithmetic of room.

Pure: no I/O, no clock. ``load_quota_config`` parses bytes it is given (a file's or a
ConfigMap key's content); reading them is the shell's job.

The section, as YAML (every key is optional; units are in the key names)::

    admission_ttl_seconds: 120        # how long an admitted pod may stay unbound
    namespaces:
      team-a:
        vcpus: 16                     # quota: whole vCPUs (compared in millicores)
        memory_bytes: 68719476736
        queueing_strategy: BestEffortFIFO   # or StrictFIFO
        cohort: research              # optional: share unused quota with these namespaces
        borrowing_limit:              # optional, only with a cohort; absent = no limit
          vcpus: 8
          memory_bytes: 17179869184
      team-b:
        vcpus: 8
        memory_bytes: 34359738368
        cohort: research

A namespace that is not listed has no quota: it is unlimited. Unknown keys are errors (a typo
must not silently drop a limit), and every error names its ``$.path``, including the namespace.

Borrowing follows kueue's cohorts: a namespace in a cohort may use more than its own quota, up
to ``quota + borrowing_limit``, as long as the cohort as a whole stays within the sum of its
members' quotas. There is no preemption, so lent quota comes back only as the borrower's VMs
shrink or stop; ``borrowing_limit`` bounds how much of the others' share one namespace can take.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec
import yaml

from protocol.bounds import Bytes, Count, PositiveSeconds
from protocol.strict_yaml import describe_yaml_error
from scheduler_extender.core.podinfo import Demand

CPU_MILLIS_PER_VCPU: Final = 1000
# DNS-1123 label: what Kubernetes allows as a namespace name.
NamespaceName = Annotated[
    str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
]
CohortName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]


class QuotaConfigError(ValueError):
    """The section is not YAML or does not match the schema; the message names ``$.path``.

    Permanent: retrying the same bytes gives the same error. The shell keeps the previous
    quotas when a reload fails, so a bad edit of the ConfigMap never lifts every limit.
    """


class QueueingStrategy(enum.StrEnum):
    """How a namespace's waiting pods overtake each other (kueue's names).

    ``BestEffortFIFO``: a pod that does not fit is set aside; later pods that fit go ahead.
    ``StrictFIFO``: the head of the queue blocks everything behind it, so a big VM is never
    starved by a stream of small ones (at the price of idle quota while it waits).
    """

    BEST_EFFORT_FIFO = "BestEffortFIFO"
    STRICT_FIFO = "StrictFIFO"


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Amount(_Section, frozen=True):
    """An amount of both resources: whole vCPUs and bytes of memory."""

    vcpus: Count
    memory_bytes: Bytes

    def demand(self) -> Demand:
        return Demand(self.vcpus * CPU_MILLIS_PER_VCPU, self.memory_bytes)


class NamespaceQuota(_Section, frozen=True):
    vcpus: Count
    memory_bytes: Bytes
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    cohort: CohortName | None = None
    # Most this namespace may use beyond its own quota, from its cohort's unused share.
    # None with a cohort: as much as the cohort has unused.
    borrowing_limit: Amount | None = None

    def __post_init__(self) -> None:
        if self.borrowing_limit is not None and self.cohort is None:
            raise ValueError("borrowing_limit needs a cohort to borrow from")

    @property
    def nominal(self) -> Demand:
        return Demand(self.vcpus * CPU_MILLIS_PER_VCPU, self.memory_bytes)


class QuotaConfig(_Section, frozen=True):
    # Seconds an admitted pod may hold its namespace's quota without being bound. Above
    # kube-scheduler's filter-to-bind latency (milliseconds) with a wide margin; below its
    # unschedulable-queue flush (5 minutes), so a pod that no node can take gives its quota
    # back to the queue rather than sitting on it while kube-scheduler backs off.
    admission_ttl_seconds: PositiveSeconds = 120.0
    namespaces: dict[NamespaceName, NamespaceQuota] = msgspec.field(default_factory=dict)

    def cohort_members(self) -> dict[str, tuple[str, ...]]:
        """Cohort name -> its namespaces, sorted (deterministic pass order)."""
        members: dict[str, list[str]] = {}
        for name, quota in self.namespaces.items():
            if quota.cohort is not None:
                members.setdefault(quota.cohort, []).append(name)
        return {c: tuple(sorted(ns)) for c, ns in members.items()}


def parse_quota_config(data: object) -> QuotaConfig:
    """An already-parsed YAML document -> QuotaConfig, or QuotaConfigError naming the path.

    Each namespace is converted on its own first, because msgspec reports a dict entry's path
    as ``$.namespaces[...]``; an error that does not say *which* namespace is useless in a
    ConfigMap with fifty of them.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise QuotaConfigError(f"Expected `object`, got `{type(data).__name__}` - at `$`")
    namespaces = data.get("namespaces")
    if isinstance(namespaces, dict):
        for name, entry in namespaces.items():
            try:
                msgspec.convert(entry, NamespaceQuota)
            except msgspec.ValidationError as e:
                raise QuotaConfigError(_at(str(e), f"$.namespaces.{name}")) from e
    try:
        return msgspec.convert(data, QuotaConfig)
    except msgspec.ValidationError as e:
        raise QuotaConfigError(_at(str(e), "$")) from e


def _at(message: str, root: str) -> str:
    """Re-root msgspec's path at ``root``; msgspec leaves the path out for the root itself."""
    if " - at `$" not in message:
        return f"{message} - at `{root}`"
    return message.replace(" - at `$", f" - at `{root}", 1)


def load_quota_config(raw: bytes) -> QuotaConfig:
    """YAML bytes (a file, or a ConfigMap's data key) -> QuotaConfig. Empty bytes: no quotas."""
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise QuotaConfigError(f"not valid YAML: {describe_yaml_error(e)}") from e
    return parse_quota_config(data)


# -- room arithmetic (per resource, millicores and bytes; negative = over the limit) --------


def minus(a: Demand, b: Demand) -> Demand:
    return Demand(a.cpu_millis - b.cpu_millis, a.memory_bytes - b.memory_bytes)


def smaller(a: Demand, b: Demand) -> Demand:
    return Demand(min(a.cpu_millis, b.cpu_millis), min(a.memory_bytes, b.memory_bytes))


def at_least_zero(a: Demand) -> Demand:
    return Demand(max(0, a.cpu_millis), max(0, a.memory_bytes))


def covers(room: Demand, need: Demand) -> bool:
    """``need`` fits in ``room``. A resource already over its limit (negative room) admits
    nothing, not even a zero need: a lowered quota stops all growth until usage falls."""
    return (
        room.cpu_millis >= 0
        and room.memory_bytes >= 0
        and need.cpu_millis <= room.cpu_millis
        and need.memory_bytes <= room.memory_bytes
    )


def shortage(room: Demand, need: Demand) -> str:
    """Which resource is short, in words, for a waiting pod's reason."""
    if need.cpu_millis > room.cpu_millis or room.cpu_millis < 0:
        return f"needs {need.cpu_millis}m cpu, {max(0, room.cpu_millis)}m left"
    return f"needs {need.memory_bytes} bytes of memory, {max(0, room.memory_bytes)} left"


__all__ = [
    "Amount",
    "NamespaceQuota",
    "QueueingStrategy",
    "QuotaConfig",
    "QuotaConfigError",
    "at_least_zero",
    "covers",
    "load_quota_config",
    "minus",
    "parse_quota_config",
    "shortage",
    "smaller",
]
