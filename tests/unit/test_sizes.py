"""``protocol.sizes.Bounds``: the one rounding of a resource's sizes, as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.sizes import Bounds


@st.composite
def bounds(draw: st.DrawFn) -> Bounds:
    low = draw(st.integers(0, 64))
    unit = draw(st.integers(1, 16))
    return Bounds(low, low + draw(st.integers(0, 200)), unit)


def _allowed(b: Bounds) -> list[int]:
    return list(range(b.min, b.max + 1, b.unit))


@given(bounds(), st.integers(-10, 400))
def test_round_down_is_the_largest_allowed_size_not_above(b: Bounds, value: int) -> None:
    below = [s for s in _allowed(b) if s <= value]
    assert b.round_down(value) == (max(below) if below else b.min)


@given(bounds(), st.integers(-10, 400))
def test_round_up_is_the_smallest_allowed_size_not_below_up_to_top(b: Bounds, value: int) -> None:
    above = [s for s in _allowed(b) if s >= value]
    assert b.round_up(value) == (min(above) if above else b.top)
    assert b.round_up(float(value)) == b.round_up(value)


@given(bounds(), st.integers(-10, 400))
def test_top_clamp_contains(b: Bounds, value: int) -> None:
    assert b.top == max(_allowed(b))
    assert b.min <= b.clamp(value) <= b.top
    assert b.contains(value) == (b.min <= value <= b.max)


def test_a_float_a_hair_above_a_step_is_that_step() -> None:
    assert Bounds(1, 8, 1).round_up(1.8 / 0.9) == 2
    assert Bounds(1, 8, 1).round_up(float("inf")) == 8
    assert Bounds(2, 9, 3).round_up(6, top=5) == 5
