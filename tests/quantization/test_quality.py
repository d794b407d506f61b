"""Held-out perplexity of the default model: float32, AWQ and RTN at group size 64 (the default model's input
sizes 576 and 1536 are multiples of 64), the quantized ones from their written checkpoints read back."""

from __future__ import annotations

import pytest

from jaxllm.quantization.quality import compare_perplexity


@pytest.mark.slow
def test_awq_beats_round_to_nearest_on_the_default_model(tmp_path):
    report = compare_perplexity(None, tmp_path, group_size=64, progress=False)
    print("\n".join(report.lines()))
    ppl = report.perplexity
    assert ppl["awq"] < ppl["rtn"]
    # measured: float32 25.33, RTN 32.92 (+30.0%) on both machines measured; AWQ 28.54 (+12.7%) on one CPU and
    # 29.16 (+15.1%) on another, also at the quantizer's own commit: most likely its grid search's near-ties
    # falling with the float32 rounding (RESULTS "AWQ quality, re-measured"). The bound covers that spread and
    # guards against more loss; the "within 10% of float32" holds at group size 32 (+8.7-9.0%), not at 64.
    assert ppl["awq"] < 1.16 * ppl["float32"]
    assert ppl["awq"] - ppl["float32"] < 0.6 * (ppl["rtn"] - ppl["float32"])
