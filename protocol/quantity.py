"""Kubernetes resource quantities as exact integers.

Pure. CPU becomes millicores and memory becomes bytes, both rounded *up* the way
Kubernetes' ``Quantity.MilliValue()``/``Value()`` do, so that our accounting never counts a
pod as smaller than the kubelet and kube-scheduler do.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import NewType

MilliCpu = NewType("MilliCpu", int)
Bytes = NewType("Bytes", int)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# Same grammar as k8s.io/apimachinery resource.ParseQuantity: sign, digits with an optional
# fraction, then a binary suffix, a decimal suffix, or a decimal exponent.
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
# Quantities larger than this are almost certainly a typo and would only overflow sums.
_MAX_VALUE = Fraction(2**63 - 1)


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity (or is negative or absurd)."""


def parse_quantity(text: str) -> Fraction:
    """Parse a quantity into an exact rational number of base units."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"invalid quantity {text!r}")
    try:
        number = Fraction(Decimal(match["num"]))
    except InvalidOperation as e:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"invalid quantity {text!r}") from e
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise QuantityError(f"quantity exponent out of range in {text!r}")
        value = number * Fraction(10) ** exponent
    if value < 0:
        raise QuantityError(f"negative quantity {text!r}")
    if value > _MAX_VALUE:
        raise QuantityError(f"quantity {text!r} is too large")
    return value


# Pods repeat a handful of quantity strings ("250m", "1Gi") tens of thousands of times, on the
# extender's hot path and in every list; parsing one costs microseconds, a cache hit nanoseconds.
@functools.lru_cache(maxsize=4096)
def cpu_millis(text: str) -> MilliCpu:
    """``"250m"`` -> 250, ``"1"`` -> 1000, ``"0.1"`` -> 100; fractions of a millicore round up."""
    value = parse_quantity(text) * 1000
    return MilliCpu(-(-value.numerator // value.denominator))


@functools.lru_cache(maxsize=4096)
def memory_bytes(text: str) -> Bytes:
    """``"128Mi"`` -> 134217728; fractions of a byte (``"1500m"``) round up."""
    value = parse_quantity(text)
    return Bytes(-(-value.numerator // value.denominator))


def format_cpu(millis: int) -> str:
    """The canonical Kubernetes form: whole cores without a suffix, else millicores."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_memory(value: int) -> str:
    """The largest binary suffix that represents ``value`` exactly."""
    for suffix, factor in reversed(_BINARY.items()):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)
