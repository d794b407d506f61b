"""Cost of stop strings per generated character: the automaton (jaxllm.stop_strings.StopMatcher, what the
detokenizer uses) against the scan it replaced (per character: a find per stop string, and a hold-back check of
each stop string's prefixes), side by side, for several numbers of stop strings.

    python benchmarks/stop_strings.py [--stops 1 16 256 10000] [--chars 4000]

Stop strings: random 8-letter strings; text: random letters and spaces (no stop string completes). Also reports
the automaton's build time (once per request; the server builds it off the engine thread).
"""

from __future__ import annotations

import argparse
import random
import string
import time

from jaxllm.stop_strings import ROOT, StopMatcher


def scan(text: str, stops: list[str]) -> None:
    """The former per-token work, one character at a time: find each stop string in the new tail, then the
    longest tail that is a proper prefix of a stop string."""
    for end in range(1, len(text) + 1):
        for stop in stops:
            text.find(stop, max(0, end - len(stop)), end)
        max((k for stop in stops for k in range(min(len(stop) - 1, end), 0, -1) if text.endswith(stop[:k], 0, end)),
            default=0)


def automaton(text: str, matcher: StopMatcher) -> None:
    state = ROOT
    for char in text:
        state = matcher.step(state, char)
        matcher.longest_stop[state], matcher.held_back[state]


def per_char_us(fn, text: str, *args) -> float:
    start = time.perf_counter()
    fn(text, *args)
    return (time.perf_counter() - start) / len(text) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, nargs="+", default=[1, 16, 256, 10000])
    parser.add_argument("--chars", type=int, default=4000)
    args = parser.parse_args()
    rng = random.Random(0)
    print("| stop strings | scan, us/char | automaton, us/char | ratio | automaton build, ms |")
    print("|---:|---:|---:|---:|---:|")
    for count in args.stops:
        stops = ["".join(rng.choices(string.ascii_letters, k=8)) for _ in range(count)]
        text = "".join(rng.choices(string.ascii_letters + " ", k=args.chars))
        start = time.perf_counter()
        matcher = StopMatcher(stops)
        build_ms = (time.perf_counter() - start) * 1e3
        scan_text = text[:max(50, args.chars * 16 // max(count, 16))]  # the scan is slow: fewer characters
        old, new = per_char_us(scan, scan_text, stops), per_char_us(automaton, text, matcher)
        print(f"| {count} | {old:.1f} | {new:.2f} | {old / new:.0f}x | {build_ms:.1f} |")


if __name__ == "__main__":
    main()
