"""A fake monotonic clock for the pure core: a round start, and it only moves forward."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    @property
    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        assert seconds >= 0, "time only moves forward"
        self._now += seconds
        return self._now
