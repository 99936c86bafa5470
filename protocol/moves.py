"""The vm-controller -> extender move protocol: ``POST /v1/moves`` on the extender's verbs
listener (``scheduler_extender.http.moves``).

Pure. A live migration's driver asks the extender, before it creates the target pod, to hold the
moving VM's room on the target node (``reserve``), and gives the hold back when the move fails
(``cancel``); a move that succeeds needs no call: the source pod's deletion ends it
(``core.ledger``, *Moves*). Strict: an unknown field, a missing one or a malformed name is a
400 naming it, and the ledger is not touched.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

# A pod name (RFC 1123 subdomain, as the API server checks pod names) and a node name.
_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
Name = Annotated[str, msgspec.Meta(pattern=_NAME, max_length=253)]
# A pod's uid as the API server issues it (an RFC 4122 UUID); anything else names no pod.
Uid = Annotated[
    str, msgspec.Meta(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
]


class _Strict(
    msgspec.Struct, rename="camel", kw_only=True, frozen=True, forbid_unknown_fields=True
):
    pass


class ReserveMove(_Strict, tag="reserve", tag_field="op", frozen=True, kw_only=True):
    """Hold the room of the VM pod ``source_uid`` on ``target_node`` for its target pod
    ``target_pod`` (same namespace), before that pod exists. ``target_node`` left out (null):
    the extender chooses it (``core.relief.choose_target``) and names it in its answer."""

    source_uid: Uid
    target_pod: Name
    target_node: Name | None = None


class CancelMove(_Strict, tag="cancel", tag_field="op", frozen=True, kw_only=True):
    """The move of ``source_uid`` is over without success: release a hold no pod took over.
    Idempotent: cancelling a move the extender does not know (any more) changes nothing."""

    source_uid: Uid


MoveRequest = ReserveMove | CancelMove


class MoveAnswer(_Strict, frozen=True, kw_only=True):
    """200: done. ``reserved``: the hold the target node now keeps for the move (0 on cancel);
    ``target_node``: the node holding it (None on cancel)."""

    op: Literal["reserve", "cancel"]
    source_uid: str
    target_node: str | None = None
    reserved_millicpu: int = 0
    reserved_memory_bytes: int = 0
