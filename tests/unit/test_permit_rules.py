"""The permit batch's rules in the pure core: version negotiation, who may send a batch, the
sequence rules (protocol v2) around ``decide_batch`` (``core.batches``, ``core.sequences``).

No HTTP here: the core answers typed refusals; their statuses are the edge's
(tests/extender/test_permit_replay.py, test_permits.py, test_front_channel.py)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.permits import PodRef, ResourceRequest, ResourceRequestBatch, Resources
from protocol.versions import SUPPORTED, ProtocolVersion, VersionRange
from scheduler_extender.core import batches
from scheduler_extender.core.ledger import Ledger, SystemReserve
from scheduler_extender.core.podinfo import Demand
from scheduler_extender.core.refusals import SEQUENCE_REFUSALS, Refusal, Refused
from scheduler_extender.core.sequences import SequenceBook
from tests.unit.test_accounting import GI, bound_vm


def _ledger() -> Ledger:
    ledger = Ledger(reserve=SystemReserve(cpu_fraction=0.2))
    ledger.upsert_node("n1", allocatable=Demand(5000, 16 * GI))  # 4000m usable
    for uid in ("a", "b"):
        bound_vm(ledger, uid, "n1")
    return ledger


def _request(uid: str, current: int, requested: int, seq: int | None) -> ResourceRequest:
    return ResourceRequest(
        pod=PodRef(namespace="ns", name=f"pod-{uid}", uid=uid),
        node="n1",
        current=Resources(vcpus=current, memory_bytes=GI),
        requested=Resources(vcpus=requested, memory_bytes=GI),
        seq=seq,
    )


def _batch(*requests: ResourceRequest, protocol: tuple[int, int] = (1, 2)) -> ResourceRequestBatch:
    return ResourceRequestBatch(
        protocol=VersionRange(min=protocol[0], max=protocol[1]), node="n1", requests=list(requests)
    )


def test_the_edge_gives_every_refusal_a_status():
    from scheduler_extender.http.permit_port import ERRORS

    assert set(ERRORS) == set(Refusal)


@pytest.mark.parametrize(
    ("theirs", "expected"),
    [((1, 1), ProtocolVersion.V1), ((1, 2), ProtocolVersion.V2), ((2, 9), ProtocolVersion.V2)],
    ids=["v1-only", "both", "newer-agent"],
)
def test_negotiate_answers_in_the_newest_version_both_speak(theirs, expected):
    assert batches.negotiate(VersionRange(min=theirs[0], max=theirs[1])) is expected


def test_no_version_in_common_is_refused_naming_both_ranges():
    refused = batches.negotiate(VersionRange(min=3, max=4))
    assert refused == Refused(
        Refusal.UNSUPPORTED_VERSION,
        "no protocol version in common: agent speaks v3..v4, extender speaks v1..v2",
    )


@given(st.integers(1, 6), st.integers(0, 4))
def test_a_negotiated_version_is_the_top_of_both_ranges(low, width):
    theirs = VersionRange(min=low, max=low + width)
    version = batches.negotiate(theirs)
    shared = [v for v in ProtocolVersion if theirs.min <= v <= theirs.max and v >= SUPPORTED.min]
    if shared:
        assert version is max(shared)
    else:
        assert isinstance(version, Refused) and version.kind is Refusal.UNSUPPORTED_VERSION


def test_a_token_speaks_for_its_own_node_only():
    batch = _batch(_request("a", 1, 2, 1))
    assert batches.admit(batch, token_node="n1") is ProtocolVersion.V2
    assert batches.admit(batch, token_node=None) is ProtocolVersion.V2  # a static token
    refused = batches.admit(batch, token_node="n2")
    assert isinstance(refused, Refused) and refused.kind is Refusal.WRONG_NODE


@pytest.mark.parametrize(
    ("protocol", "first", "then", "refusal"),
    [
        ((1, 2), 5, 5, Refusal.STALE_SEQUENCE),
        ((1, 2), 5, 4, Refusal.STALE_SEQUENCE),
        ((1, 2), 5, None, Refusal.SEQUENCE_MISSING),
        ((1, 1), 5, None, Refusal.SEQUENCE_REQUIRED),
        ((1, 1), None, None, None),
        ((1, 2), 5, 6, None),
    ],
    ids=["replayed", "reordered", "v2-without", "v1-after-a-seq", "v1-never", "newer"],
)
def test_sequence_rules(protocol, first, then, refusal):
    ledger, book = _ledger(), SequenceBook()
    version = batches.negotiate(VersionRange(min=protocol[0], max=protocol[1]))
    assert isinstance(version, ProtocolVersion)
    if first is not None:  # an earlier v2 request, applied
        (d,) = _decided(ledger, book, _batch(_request("a", 1, 2, first)))
        assert d.refused is None and d.permit.seq == first
    (d,) = _decided(ledger, book, _batch(_request("a", 2, 3, then), protocol=protocol))
    assert (d.refused.kind if d.refused is not None else None) is refusal
    if refusal is Refusal.STALE_SEQUENCE:
        assert d.permit.seq == first  # the floor the agent continues above


def _decided(ledger, book, batch):
    version = batches.negotiate(batch.protocol)
    assert isinstance(version, ProtocolVersion)
    decisions = batches.decide(ledger, book, batch, version)
    assert not isinstance(decisions, Refused)
    return decisions


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from("ab"), st.integers(1, 4), st.integers(1, 12)),
            min_size=1,
            max_size=3,
        ),
        max_size=12,
    )
)
def test_a_refused_sequence_never_changes_the_ledger_and_applied_seqs_only_grow(batches_sent):
    """Any order of v2 batches: a request the sequence rules refuse leaves the ledger as a
    batch without it would (here: exactly as it was, when all of a batch is refused), and a
    VM's applied seqs strictly grow."""
    ledger, book = _ledger(), SequenceBook()
    applied: dict[str, list[int]] = {"a": [], "b": []}
    held = {"a": 1, "b": 1}
    for sent in batches_sent:
        requests = [_request(uid, held[uid], want, seq) for uid, want, seq in sent]
        before = msgspec.json.encode(ledger.nodes)
        decisions = _decided(ledger, book, _batch(*requests))
        assert len(decisions) == len(requests)
        for req, d in zip(requests, decisions, strict=True):
            if d.refused is not None:
                assert d.refused.kind in SEQUENCE_REFUSALS
                assert req.seq is not None and d.permit.seq is not None
                assert req.seq <= d.permit.seq
            else:
                assert req.seq is not None and d.permit.seq == req.seq
                applied[req.pod.uid].append(req.seq)
                assert d.permit.permit is not None
                held[req.pod.uid] = d.permit.permit.vcpus
        if all(d.refused is not None for d in decisions):
            assert msgspec.json.encode(ledger.nodes) == before
    for seqs in applied.values():
        assert seqs == sorted(set(seqs))


def test_a_request_the_ledger_refuses_records_no_seq():
    """Out of bounds: refused by ``decide_batch``; its seq is not spent, so the agent's
    corrected request may carry it."""
    ledger, book = _ledger(), SequenceBook()
    (d,) = _decided(ledger, book, _batch(_request("a", 1, 99, 5)))
    assert d.refused is not None and d.refused.kind is Refusal.OUT_OF_BOUNDS
    assert book.last("a") is None
    (d,) = _decided(ledger, book, _batch(_request("a", 1, 2, 5)))
    assert d.refused is None and d.permit.seq == 5


def test_a_batch_refused_whole_records_no_seq():
    ledger, book = _ledger(), SequenceBook()
    ledger.upsert_node("n2", allocatable=Demand(5000, 16 * GI))
    bound_vm(ledger, "c", "n2")
    other = msgspec.structs.replace(_request("c", 1, 2, 9), node="n1")
    before = msgspec.json.encode(ledger.nodes)
    refused = batches.decide(
        ledger, book, _batch(_request("a", 1, 2, 7), other), ProtocolVersion.V2
    )
    assert isinstance(refused, Refused) and refused.kind is Refusal.WRONG_NODE
    assert msgspec.json.encode(ledger.nodes) == before
    assert book.last("a") is None  # so the agent's retry with seq 7 is not a replay
