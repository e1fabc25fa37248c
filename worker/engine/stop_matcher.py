"""Find the earliest of many stop strings in a text in one pass (Aho-Corasick).

The cost of a search is linear in the text searched plus the matches found, whatever
the number of stop strings; the automaton is built once per distinct list of stops.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


class StopMatcher:
    """An Aho-Corasick automaton over a fixed list of non-empty stop strings."""

    def __init__(self, stops: Sequence[str]) -> None:
        """Build the automaton; ``stops`` are searched for all at once."""
        self.stops = tuple(stops)
        self._goto: list[dict[str, int]] = [{}]
        self._fail: list[int] = [0]
        self._out: list[list[int]] = [[]]  # per state: indices of stops ending here
        for index, stop in enumerate(self.stops):
            state = 0
            for ch in stop:
                nxt = self._goto[state].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto.append({})
                    self._fail.append(0)
                    self._out.append([])
                    self._goto[state][ch] = nxt
                state = nxt
            self._out[state].append(index)
        queue = deque(self._goto[0].values())
        while queue:
            state = queue.popleft()
            for ch, nxt in self._goto[state].items():
                queue.append(nxt)
                fail = self._fail[state]
                while fail and ch not in self._goto[fail]:
                    fail = self._fail[fail]
                target = self._goto[fail].get(ch, 0)
                self._fail[nxt] = target if target != nxt else 0
                self._out[nxt] = self._out[nxt] + self._out[self._fail[nxt]]

    def earliest(self, text: str, *, end_from: int = 0) -> tuple[int, str] | None:
        """The (start index, stop string) of the match that starts first among those
        ending at or after ``end_from`` (a match must end there or later: it then
        involves new text); on equal starts the stop listed first wins."""
        best: tuple[int, int] | None = None  # (start, stop index)
        state = 0
        goto, fail, out = self._goto, self._fail, self._out
        for pos, ch in enumerate(text):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if pos + 1 <= end_from or not out[state]:
                continue
            for index in out[state]:
                start = pos + 1 - len(self.stops[index])
                if best is None or (start, index) < best:
                    best = (start, index)
        if best is None:
            return None
        return best[0], self.stops[best[1]]


class MatcherCache:
    """The automata of recently seen stop lists (least recently used dropped first)."""

    def __init__(self, capacity: int = 256) -> None:
        """Keep at most ``capacity`` automata."""
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, ...], StopMatcher] = OrderedDict()

    def get(self, stops: Sequence[str]) -> StopMatcher:
        """The automaton of ``stops``, built on first use."""
        key = tuple(stops)
        matcher = self._items.get(key)
        if matcher is None:
            matcher = StopMatcher(key)
            self._items[key] = matcher
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return matcher
