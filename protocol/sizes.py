"""A resource's allowed sizes: ``min + k * unit``, at most ``max``. One type for vCPUs and memory.

Pure. A VM's pod declares, per resource, a minimum, a maximum and a step (``protocol.annotations``:
``min-vcpus``/``max-vcpus``/``scaling-unit``, ``min-memory``/``max-memory``/``memory-unit``). Every
side rounds to the same sizes: the extender rounds a grant *down* (``core.permits``: never more
than asked or than fits), the agent rounds a goal *up* (``policy``, ``memory_policy``: never less
than the load needs) and a resize down to its permit (``core``), and the simulator's guests give
memory back in whole steps (``simulator.world``). Written once here, so that the two sides never
disagree on what a size is (upstream's ``NodeResources[T]`` in neondatabase/autoscaling keeps CPU
and memory in one generic type for the same reason).

``top`` is the largest allowed size: ``max`` rounded down (a ``max`` that is not ``min + k * unit``
is never reached). ``round_up`` stops at ``top``, or at a lower ``top`` the caller knows (the
hypervisor's own maximum).
"""

from __future__ import annotations

import math
from functools import cached_property

import msgspec

# A float size within this fraction of a step above a step counts as that step: a ratio such as
# 1.8 / 0.9 == 2.0000000000000004 must not round up to the next size.
_EPSILON = 1e-9


class Bounds(msgspec.Struct, frozen=True, dict=True):
    """One resource's bounds: sizes ``min + k * unit`` (``k >= 0``), at most ``max``."""

    min: int
    max: int
    unit: int = 1

    def round_down(self, value: int) -> int:
        """The largest allowed size <= ``value`` (never below ``min``, never above ``max``)."""
        if value <= self.min:
            return self.min
        unit = self.unit
        return self.min + (min(value, self.max) - self.min) // unit * unit

    def round_up(self, value: float, *, top: int | None = None) -> int:
        """The smallest allowed size >= ``value``, at most ``top`` (default: ``self.top``) and
        never below ``min``. An int is rounded exactly; a float (a load's need) with a
        tolerance of ``_EPSILON`` of a step, and ``inf`` gives ``top``."""
        low = self.min
        if value <= low:
            return low
        ceiling = self.top if top is None else top
        if not value < ceiling:
            return ceiling
        unit = self.unit
        if type(value) is int:
            steps = -((low - value) // unit)
        else:
            steps = math.ceil((value - low) / unit - _EPSILON)
        size = low + steps * unit
        return size if size < ceiling else ceiling

    def clamp(self, value: int) -> int:
        """``value`` held within ``[min, top]`` (not rounded to a step)."""
        return self.min if value < self.min else min(value, self.top)

    def contains(self, value: int) -> bool:
        """Whether ``value`` lies within ``[min, max]`` (what an agent may ask for)."""
        return self.min <= value <= self.max

    @cached_property
    def top(self) -> int:
        """The largest allowed size (``max`` rounded down to the unit)."""
        return self.round_down(self.max)
