"""StopMatcher: every stop string of a request found in its text one character at a time, at a cost per character
that does not grow with the number of stop strings (an Aho-Corasick automaton).

A state is a node of the trie of the stop strings: the longest tail of the text read so far that begins some stop
string. Per node, precomputed once:

    longest_stop[node]   the longest stop string that is a tail of the node's text (0: none ends here)
    held_back[node]      the longest tail of the node's text that is a proper prefix of a stop string (what a
                         stream must hold back: it may still grow into a stop string)

    state = matcher.step(state, char)       amortized O(1): follows failure links where the trie has no edge

Built from the stop strings in time and memory linear in their total length (SamplingParams.stop_matcher builds
it once per request's parameters).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

ROOT = 0


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self._edges: list[dict[str, int]] = [{}]  # node -> {char: child}
        depth, own = [0], [0]  # own: the length of the stop string ending exactly at the node (0: none)
        for stop in stops:
            node = ROOT
            for char in stop:
                child = self._edges[node].get(char)
                if child is None:
                    child = self._edges[node][char] = len(self._edges)
                    self._edges.append({})
                    depth.append(depth[node] + 1)
                    own.append(0)
                node = child
            own[node] = len(stop)
        self._fail = [ROOT] * len(self._edges)
        self.longest_stop = list(own)
        self.held_back = [0] * len(self._edges)
        self._link(depth, own)

    def _link(self, depth: list[int], own: list[int]) -> None:
        """Failure links, breadth first (a node's link is shallower, so its tables are final when it is read)."""
        queue = deque(self._edges[ROOT].values())
        while queue:
            node = queue.popleft()
            fail = self._fail[node]
            self.longest_stop[node] = own[node] or self.longest_stop[fail]
            self.held_back[node] = depth[node] if self._edges[node] else self.held_back[fail]
            for char, child in self._edges[node].items():
                self._fail[child] = self._next(fail, char) if node != ROOT else ROOT
                queue.append(child)

    def _next(self, node: int, char: str) -> int:
        while True:
            child = self._edges[node].get(char)
            if child is not None:
                return child
            if node == ROOT:
                return ROOT
            node = self._fail[node]

    def step(self, state: int, char: str) -> int:
        """The state after reading `char`."""
        return self._next(state, char)
