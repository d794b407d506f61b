"""Held-out perplexity of float32, AWQ and RTN int4 weights, side by side in one run (CPU).

    python benchmarks/awq_quality.py                       # the default model, group size 64
    python benchmarks/awq_quality.py --group-size 32 --keep ckpts/   # keep the written checkpoints

The model is loaded once; each method quantizes it and writes a checkpoint (`jaxllm quantize`'s code path), which
is read back and dequantized with the format's own unpacker. Perplexity is computed by one dense forward over
the held-out text (jaxllm/quantization/held_out.txt, which the built-in calibration text does not overlap), in
windows of up to 512 tokens. Issue goal: AWQ within 10% of float32 and below RTN.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time

import jax

from jaxllm.quantization.quality import compare_perplexity


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model to quantize (default: the default model)")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--methods", nargs="+", default=["awq", "rtn"], choices=["awq", "rtn"])
    parser.add_argument("--no-clip", dest="clip", action="store_false", help="AWQ without the clipping search")
    parser.add_argument("--grid", type=int, default=20, help="alpha grid of the scale search")
    parser.add_argument("--calibration", default=None, help="calibration text file (default: the built-in text)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="write the checkpoints here (default: a "
                        "temporary directory, removed afterwards)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    text = None
    if args.calibration:
        from jaxllm.quantization.calibration import read_text

        text = read_text(args.calibration)
    print(f"{datetime.date.today()} {platform.processor() or platform.machine()}, jax {jax.__version__} "
          f"({jax.default_backend()}), command: {' '.join(sys.argv)}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = compare_perplexity(args.model, args.keep or tmp, args.group_size, tuple(args.methods),
                                    clip=args.clip, n_grid=args.grid, text=text)
    for line in report.lines():
        print(line)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items())
          + f"; total {time.perf_counter() - start:.1f}")
    base = report.perplexity["float32"]
    if "awq" in report.perplexity:
        awq = report.perplexity["awq"]
        within = awq <= 1.1 * base
        below = "rtn" not in report.perplexity or awq < report.perplexity["rtn"]
        print(f"goal (AWQ within 10% of float32 and below RTN): {'met' if within and below else 'NOT met'}")
    if args.json:
        print(json.dumps({"group_size": report.group_size, "eval_tokens": report.eval_tokens,
                          "perplexity": report.perplexity, "seconds": report.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
