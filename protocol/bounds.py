"""How large a number on any wire or in any config may be: one place for the bounds.

Pure. msgspec checks an ``Annotated`` bound while decoding, so a number out of range is a
decode error naming its ``$.path`` (a 400 on the HTTP wire, a config error in a file) and never
reaches the code that would overflow on it: a ``2**64`` vCPU count used to pass the decoder and
fail as a 500 further in. ``tests/unit/test_wire_bounds.py`` walks every wire and config type
and fails on any integer or float left without both an upper and a lower bound.

The bounds are what the code does with a number, or Kubernetes' own widths where the number is
Kubernetes':

* counts, priorities, generations: int32 or int64, as the API declares them;
* bytes and quantities: a ``Quantity`` stops at ``2**63 - 1``;
* vCPUs: ``MAX_VCPUS``, the most the ``max-vcpus`` annotation accepts;
* seconds: a year at most, so every deadline the code computes from one stays a finite float;
* rates: a billion per second, far beyond anything a token bucket here is meant to pass.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1
MAX_VCPUS: Final = 4096
MAX_SECONDS: Final = 366 * 86_400.0
MAX_RATE: Final = 1e9

Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Vcpus = Annotated[int, msgspec.Meta(ge=0, le=MAX_VCPUS)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
Rate = Annotated[float, msgspec.Meta(gt=0, le=MAX_RATE)]
# A quantity written as a YAML or JSON number (``cpu: 2``) rather than text.
NumericQuantity = (
    Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    | Annotated[float, msgspec.Meta(ge=0, le=float(INT64_MAX))]
)
