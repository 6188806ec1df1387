"""Stop strings across token boundaries.

A stop string may arrive split over several tokens ("<|", "end", "|>"), so text that *could*
be the start of a stop string is held back until the next piece decides it. The stop text
itself is never emitted; whatever came before it in the same piece is.

    >>> m = StopMatcher(["STOP"])
    >>> m.push("Hello ST")      # "ST" may begin "STOP": held back
    ('Hello ', False)
    >>> m.push("OP and more")   # completed: the text after the stop is dropped too
    ('', True)
    >>> m = StopMatcher(["STOP"])
    >>> m.push("ST"), m.push("ay"), m.flush()
    (('', False), ('STay', False), '')
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed generated text piece by piece; get back what is safe to show."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.hit: str | None = None  # the stop string that matched
        # The longest proper prefix of a stop that can be pending at the end of the text.
        self._max_hold = max((len(s) - 1 for s in self.stops), default=0)

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text to emit now, whether a stop string was hit). After a hit every
        further push returns ("", True)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        cut = -1
        for stop in self.stops:
            i = buf.find(stop)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
                self.hit = stop
        if cut != -1:
            self._held = ""
            self.stopped = True
            return buf[:cut], True
        hold = self._pending_prefix(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        """The held-back text, at the end of a reply that did not stop on a stop string."""
        out, self._held = self._held, ""
        return "" if self.stopped else out

    def _pending_prefix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop."""
        longest = 0
        for n in range(min(self._max_hold, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                longest = n
                break
        return longest
