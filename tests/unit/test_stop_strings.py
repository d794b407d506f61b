"""StopMatcher against a brute-force reference: after every character of random texts over a small alphabet (many
overlaps), the longest stop string ending there and the longest tail that is a proper prefix of a stop string."""

from __future__ import annotations

import random

import pytest

from jaxllm.stop_strings import ROOT, StopMatcher


def brute_force(text: str, stops: list[str]) -> tuple[int, int]:
    longest = max((len(s) for s in stops if text.endswith(s)), default=0)
    held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return longest, held


@pytest.mark.parametrize("seed", range(20))
def test_every_step_matches_brute_force(seed):
    rng = random.Random(seed)
    alphabet = "ab" if seed % 2 else "abcé🎉"
    stops = list({"".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 12))})
    text = "".join(rng.choices(alphabet, k=200))
    matcher, state = StopMatcher(stops), ROOT
    for end in range(1, len(text) + 1):
        state = matcher.step(state, text[end - 1])
        assert (matcher.longest_stop[state], matcher.held_back[state]) == brute_force(text[:end], stops), \
            (stops, text[:end])


def test_cost_per_character_does_not_grow_with_the_stop_strings():
    """Steps over a text are as many dictionary lookups with 10 stop strings as with 5,000 (counted, not timed)."""
    rng = random.Random(0)

    def lookups(num_stops: int) -> int:
        matcher = StopMatcher(["".join(rng.choices("abcdefgh", k=8)) for _ in range(num_stops)])
        counted = CountingEdges(matcher)
        state = ROOT
        for char in "".join(rng.choices("abcdefgh", k=2000)):
            state = matcher.step(state, char)
        return counted.count

    assert lookups(5000) < 2 * lookups(10) + 2000


class CountingEdges:
    """Wraps a matcher's edge dictionaries so that every lookup is counted."""

    def __init__(self, matcher: StopMatcher):
        self.count = 0
        outer = self

        class Counted(dict):
            def get(self, key, default=None):
                outer.count += 1
                return super().get(key, default)

        matcher._edges = [Counted(edges) for edges in matcher._edges]
