"""What a bearer token's own unverified claims say, before anyone spends a TokenReview on it.

Pure. A ServiceAccount token is a JWT whose claims (``aud``, ``exp``) are readable without its
key. They are never *trusted* here (only the API server's TokenReview grants anything), but
they can rule a token out: a string that is not a JWT, a token issued for another audience,
or one already expired can never pass the review. Such tokens are refused locally, so a flood
of garbage neither reaches the API server nor spends the review budget that agents need
after an extender restart, when every agent's token is new to it. A forged JWT with the
right claims still goes to review, within the budget.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

import msgspec

# Real tokens are about 1 KB; anything far larger is not one (and is not worth decoding).
MAX_TOKEN_BYTES: Final = 16 * 1024
# Clocks of the extender and the API server differ a little; never refuse what the API
# server might still accept.
EXPIRY_SKEW_SECONDS: Final = 60.0
_B64URL: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class _Claims(msgspec.Struct, frozen=True):
    aud: str | list[str] | None = None
    exp: float | None = None


_decoder: Final = msgspec.json.Decoder(_Claims)


def local_refusal(token: str, *, audience: str, now: float) -> str | None:
    """Why ``token`` cannot pass a TokenReview for ``audience`` at wall time ``now``, judged
    from its claims alone; None when it might (the review decides)."""
    raw = token.encode("ascii", "replace")
    parts = raw.split(b".")
    if (
        len(raw) > MAX_TOKEN_BYTES
        or len(parts) != 3
        or not all(part and set(part) <= _B64URL for part in parts)
    ):
        return "not a ServiceAccount token (not a JWT)"
    try:
        claims = _decoder.decode(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return "not a ServiceAccount token (its claims are not a JSON object)"
    audiences = [claims.aud] if isinstance(claims.aud, str) else claims.aud or []
    if audience not in audiences:
        # The API server's own words for it (tests/reference/kube/api/tokenreview-*.json).
        return (
            f"token audiences {_quote(audiences)} is invalid for the target audiences"
            f" {_quote([audience])}"
        )
    if claims.exp is not None and claims.exp + EXPIRY_SKEW_SECONDS < now:
        return "token has expired"
    return None


def _quote(values: list[str]) -> str:
    return "[" + " ".join(f'"{v}"' for v in values) + "]"
