"""Golden bytes: the recommender's answer must not drift when its code is reorganised or sped up.

``basic.recommendation.json`` is ``encode_recommendation`` of ``examples/snapshots/basic.yaml``
with the default config but the full diagnostics. The benchmark snapshot (1,000 pending pods,
500 nodes, 10 pools x 3 zones) is pinned by the SHA-256 of its full answer (a 1 MB file is not
worth committing). If a change *means* to alter the answer, regenerate both and say why in the
commit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from scheduler_extender.recommender import (
    DiagnosticsLevel,
    RecommenderConfig,
    Scorer,
    decode_snapshot,
    encode_recommendation,
    load_snapshot,
    recommend,
)
from testkit.recommender_snapshot import generate

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def test_basic_example_answer_is_the_golden_bytes():
    data = (ROOT / "examples/snapshots/basic.yaml").read_bytes()
    answer = encode_recommendation(
        recommend(
            load_snapshot(data, fmt="yaml"),
            config=RecommenderConfig(diagnostics=DiagnosticsLevel.FULL),
        )
    )
    assert answer == (DATA / "basic.recommendation.json").read_bytes()


def test_prepared_and_plain_snapshots_give_the_same_bytes():
    data = (ROOT / "examples/snapshots/basic.yaml").read_bytes()
    plain = decode_snapshot(data, fmt="yaml")
    config = RecommenderConfig()
    assert encode_recommendation(recommend(plain, config=config)) == encode_recommendation(
        recommend(load_snapshot(data, fmt="yaml"), config=config)
    )


@pytest.mark.parametrize(
    ("chain", "digest"),
    [
        (
            (Scorer.PRIORITY, Scorer.LEAST_WASTE, Scorer.MOST_PODS),
            "6f0d27f2658479f8b5de1c9ea248783ba04bf029d53a3b8ef4c11fe0bb4604db",
        ),
        ((Scorer.LEAST_COST,), "bd0b82d336d69f86eedcde8616e0b3c5a0c0f2373bda71096003ac26a8b50f59"),
    ],
    ids=["default-chain", "least-cost"],
)
def test_benchmark_snapshot_answer_is_unchanged(chain, digest):
    prepared = load_snapshot(msgspec.json.encode(generate()))
    answer = encode_recommendation(
        recommend(
            prepared, config=RecommenderConfig(scorers=chain, diagnostics=DiagnosticsLevel.FULL)
        )
    )
    assert hashlib.sha256(answer).hexdigest() == digest
