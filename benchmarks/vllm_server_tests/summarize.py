"""Per-file counts and failure messages of a run of vLLM's server tests (from <work dir>/results/*.xml, JUnit).

    python summarize.py [--workdir DIR]     # DIR: default $VLLM_TESTS_DIR, else ./.vllm-tests

Outcomes: passed, failed, error (in a fixture: usually the server did not start), skip:scope (out of scope),
skip:internals (a unit test of vLLM's own classes), skip:other. Failures are listed with the start of their message,
for sorting by hand into those that depend on another model's exact outputs and real gaps of `jaxllm serve`.
"""
import argparse
import os
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

MESSAGE_CHARS = 300


def skip_kind(message: str) -> str:
    """The skip category of a skip reason written by the shim's conftest."""
    if "out of scope" in message:
        return "skip:scope"
    if "internals" in message:
        return "skip:internals"
    return "skip:other"


def outcome(testcase: ET.Element) -> tuple[str, str]:
    """(outcome, message) of one JUnit testcase."""
    for child in testcase:
        message = child.get("message") or ""
        if child.tag == "failure":
            return "failed", message
        if child.tag == "error":
            return "error", message
        if child.tag == "skipped":
            return skip_kind(message), message
    return "passed", ""


def summarize_file(path: Path) -> tuple[Counter, list[tuple[str, str, str]]]:
    """Counts by outcome, and (outcome, test name, message) of each failure or error."""
    counts = Counter()
    failures = []
    for testcase in ET.parse(path).getroot().iter("testcase"):
        kind, message = outcome(testcase)
        counts["collected"] += 1
        counts[kind] += 1
        if kind in ("failed", "error"):
            failures.append((kind, testcase.get("name"), message[:MESSAGE_CHARS].replace("\n", " ")))
    return counts, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("VLLM_TESTS_DIR", ".vllm-tests")))
    args = parser.parse_args()
    results = sorted((args.workdir / "results").glob("*.xml"))
    if not results:
        raise SystemExit(f"no results in {args.workdir / 'results'}: run run.sh first")
    total = Counter()
    for path in results:
        counts, failures = summarize_file(path)
        total.update(counts)
        print(path.stem, dict(counts))
        for kind, name, message in failures:
            print(f"   {kind} {name}: {message}")
    print("TOTAL", dict(total))


if __name__ == "__main__":
    main()
