"""token_shape: which tokens their own claims rule out before any TokenReview."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from scheduler_extender.kube.token_shape import MAX_TOKEN_BYTES, local_refusal
from testkit.kube_api import fake_jwt
from tests.kube_io.conftest import sample_bytes

AUDIENCE = "vm-autoscaling-extender"
NOW = 1_795_262_000.0  # inside the recorded token's lifetime


def _jwt_with(claims: bytes) -> str:
    payload = base64.urlsafe_b64encode(claims).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln"


def test_the_recorded_agent_token_claims_may_pass() -> None:
    """token-claims.json: what a real kube-apiserver put in an agent's pod-bound token."""
    claims = sample_bytes("token-claims.json")
    assert local_refusal(_jwt_with(claims), audience=AUDIENCE, now=NOW) is None
    expiry = json.loads(claims)["exp"]
    # Clocks differ: a minute of grace, then it is expired.
    assert local_refusal(_jwt_with(claims), audience=AUDIENCE, now=expiry + 59) is None
    assert local_refusal(_jwt_with(claims), audience=AUDIENCE, now=expiry + 61) == (
        "token has expired"
    )
    assert "invalid for the target audiences" in (
        local_refusal(_jwt_with(claims), audience="another", now=NOW) or ""
    )


def test_a_single_audience_string_counts() -> None:
    claims = json.dumps({"aud": AUDIENCE}).encode()
    assert local_refusal(_jwt_with(claims), audience=AUDIENCE, now=NOW) is None


def test_oversized_tokens_are_not_decoded() -> None:
    token = fake_jwt("big", audiences=[AUDIENCE + "x" * MAX_TOKEN_BYTES])
    assert local_refusal(token, audience=AUDIENCE, now=NOW) == (
        "not a ServiceAccount token (not a JWT)"
    )


@given(st.text(max_size=300))
def test_anything_is_an_answer_never_a_crash(token: str) -> None:
    refusal = local_refusal(token, audience=AUDIENCE, now=NOW)
    assert refusal is None or refusal.startswith(("not a", "token"))


@given(st.binary(max_size=200))
def test_any_claims_bytes_are_an_answer_never_a_crash(claims: bytes) -> None:
    local_refusal(_jwt_with(claims), audience=AUDIENCE, now=NOW)
