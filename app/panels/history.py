"""Bounded time series for the live panels (pure Python, no Qt).

    >>> s = Series(maxlen=3)
    >>> for t, v in [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]:
    ...     s.append(t, v)
    >>> s.xs(now=3.0), s.ys()
    ([-2.0, -1.0, 0.0], [2.0, 3.0, 4.0])
"""

from __future__ import annotations

from collections import deque

WINDOW = 300  # samples kept: five minutes at one snapshot a second


class Series:
    def __init__(self, maxlen: int = WINDOW) -> None:
        self._t: deque[float] = deque(maxlen=maxlen)
        self._v: deque[float] = deque(maxlen=maxlen)

    def __len__(self) -> int:
        return len(self._v)

    def append(self, t: float, value: float) -> None:
        self._t.append(t)
        self._v.append(value)

    def clear(self) -> None:
        self._t.clear()
        self._v.clear()

    def xs(self, now: float) -> list[float]:
        """Seconds relative to `now` (so the newest point sits at 0 on the time axis)."""
        return [t - now for t in self._t]

    def ys(self) -> list[float]:
        return list(self._v)

    @property
    def last(self) -> float | None:
        return self._v[-1] if self._v else None
