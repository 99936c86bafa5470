"""One cached msgspec Encoder/Decoder per type, and decode errors with a ``$.path``.

Pure. Building a msgspec Decoder is not free; handlers on the hot path reuse these.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

ENCODER = msgspec.json.Encoder()


class ProtocolError(ValueError):
    """A body that is not valid JSON or does not match the expected type.

    The message is msgspec's, which names the offending location, e.g.
    ``Expected `int` >= 0, got `-1` - at `$.requests[0].current.vcpus```.
    """


_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def decoder(type_: type[T]) -> msgspec.json.Decoder[T]:
    found = _DECODERS.get(type_)
    if found is None:
        found = _DECODERS[type_] = msgspec.json.Decoder(type_)
    return found


def decode(type_: type[T], data: bytes | msgspec.Raw | str) -> T:
    try:
        value: T = decoder(type_).decode(data)
        return value
    except msgspec.ValidationError as e:
        raise ProtocolError(str(e)) from e
    except msgspec.DecodeError as e:
        raise ProtocolError(f"malformed JSON: {e}") from e
    except RecursionError as e:
        # msgspec gives up on deep nesting (~1,000 levels, a 2 KB body) with a RecursionError;
        # it is bad input like any other, not a fault of ours.
        raise ProtocolError("malformed JSON: nested too deeply") from e


def encode(value: Any) -> bytes:
    return ENCODER.encode(value)
