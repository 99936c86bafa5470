"""The agent<->extender permit protocol (see ``versions`` for the changelog).

Pure. How to read a ResourceRequest, per resource (vCPUs and memory independently):

* ``requested < current`` is a *notice*: the agent has already shrunk the VM to
  ``requested``; the extender frees the difference at once.
* ``requested == current`` is *steady*: the permit is ``current``; the extender keeps holding
  what the agent still claims (``lastPermit``) and nothing beyond it. Agents send steady
  requests to report a VM's size, e.g. after the extender restarted (see ``PermitBatch.epoch``).
* ``requested > current`` is a *request*: the extender grants
  ``current <= permit <= requested``, rounded down to the VM's scaling unit and limited by
  what the node (and the namespace quota) has left.

Memory differs in one way: a VM's memory only grows through a permit, so a size *above what
the extender holds for the VM* (a ``current``, or a notice's ``requested``) is believed only as
far as the node has room for it, and the permit's memory may then be *below* ``current``: the
agent must give the rest back. A memory notice's ``requested`` is the size the guest really
reached: a shrink the guest could not complete is reported at what it gave back, never at the
size it was asked for (the extender frees exactly what is reported).

``last_permit`` is the last permit the agent holds. A restarted extender whose durable record
(the pod annotation) was lost uses it to rebuild, so a restart never takes vCPUs from a VM.

``seq`` (v2) orders one VM's requests: the extender applies a request only if its seq is above
the last it applied for that VM (see ``versions.ProtocolVersion.V2``).

Requests are batched: one HTTP request carries every VM of one node and gets one Permit each,
so a node with 100 VMs costs one round trip per tick.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from protocol.bounds import INT64_MAX, MAX_RATE, Bytes, Int32, Vcpus
from protocol.versions import VersionRange

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
# A node with more VMs than this is not a node; the cap keeps one request's work bounded.
MAX_BATCH = 1024
Seq = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]


class _Wire(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    pass


class Resources(_Wire, frozen=True):
    vcpus: Vcpus
    memory_bytes: Bytes


class PodRef(_Wire, frozen=True):
    namespace: Name
    name: Name
    uid: Name

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class LoadReport(_Wire, frozen=True):
    """What the agent saw, for the extender's logs, metrics and the recommender."""

    load1: Annotated[float, msgspec.Meta(ge=0, le=MAX_RATE)]
    cpu_busy_fraction: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    memory_used_fraction: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


class ResourceRequest(_Wire, frozen=True):
    pod: PodRef
    node: Name
    current: Resources
    requested: Resources
    last_permit: Resources | None = None
    load: LoadReport | None = None
    # v2: per VM, larger than in any earlier request for it (the agent uses microseconds of
    # wall-clock time as a floor, so it keeps growing across the agent's restarts).
    seq: Seq | None = None


class ResourceRequestBatch(_Wire, frozen=True):
    protocol: VersionRange
    node: Name
    requests: Annotated[list[ResourceRequest], msgspec.Meta(max_length=MAX_BATCH)]


class PermitStatus(enum.StrEnum):
    GRANTED = "granted"  # permit == requested (an increase, fully granted)
    PARTIAL = "partial"  # current < permit < requested
    DENIED = "denied"  # an increase, but permit == current
    RELEASED = "released"  # a decrease was recorded
    STEADY = "steady"  # requested == current


class ItemError(_Wire, frozen=True):
    """Why one VM's request failed; ``status`` is the HTTP status it would have on its own."""

    status: Annotated[int, msgspec.Meta(ge=100, le=599)]
    reason: str
    message: str


class Permit(_Wire, frozen=True):
    """The answer for one VM: what it may use now, or an error for this VM alone."""

    pod: PodRef
    permit: Resources | None = None
    status: PermitStatus | None = None
    reason: str = ""
    error: ItemError | None = None
    # v2: the request's seq when it was applied; with a ``StaleSequence`` error, the last seq
    # the extender applied for this VM (the agent continues above it).
    seq: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None


class PermitBatch(_Wire, frozen=True):
    protocol: Int32
    node: str
    permits: list[Permit]
    # The extender's incarnation: a new value after every restart. An agent that sees it change
    # reports every VM of its node at once (with ``lastPermit``), because a rebuilt ledger holds
    # the VMs it has not heard from at their maximum until then. Agents may send a batch with no
    # requests just to learn it. Empty from extenders that predate it (a tolerant reader).
    epoch: str = ""


class ErrorBody(_Wire, frozen=True):
    """Body of every non-2xx answer on the permit port."""

    error: str
    reason: str
    message: str
