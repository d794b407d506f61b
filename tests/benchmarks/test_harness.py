"""The jitted benchmark harness: cost analysis, compile/run separation, statistics, ceilings, tables."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from jaxllm.benchmarks.harness import (
    Ceiling,
    Timing,
    _cost,
    format_table,
    measure_ceiling,
    time_jitted,
)


def test_matmul_cost_analysis_counts_2mnk_flops_and_operand_bytes():
    m, k, n = 64, 32, 16
    t = time_jitted(jnp.matmul, jnp.ones((m, k)), jnp.ones((k, n)), name="mm", iters=3)
    assert t.flops == 2 * m * n * k  # XLA:CPU reports exactly one multiply-add (2 flops) per (m, n, k)
    assert t.bytes_accessed == 4 * (m * k + k * n + m * n)  # float32: read both operands, write the product


def test_compiles_once_then_times_exactly_iters_runs():
    traces, compiles = [], []

    def f(x):
        traces.append(1)  # runs at trace time only
        return jnp.sin(x) @ x

    def on_event(event, secs, **_):
        if "backend_compile" in event:
            compiles.append(secs)

    x = jnp.ones((32, 32))
    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        t = time_jitted(f, x, name="f", warmup=3, iters=7)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    # traced and compiled once, by lower().compile(); warm-up and timed runs reuse that executable
    assert len(traces) == 1 and len(compiles) == 1
    assert t.compile_s > 0 and len(t.times_s) == 7 and all(s > 0 for s in t.times_s)
    assert t.name == "f"


def test_accepts_a_jit_object_and_keeps_running_until_min_time():
    t = time_jitted(jax.jit(lambda x: x * 2), jnp.ones(1000), iters=1, warmup=0, min_time_s=0.02)
    assert sum(t.times_s) >= 0.02 and len(t.times_s) > 1


def test_donated_arguments_are_refused():
    x = jnp.ones(4)
    with pytest.raises(ValueError, match="donated"):
        time_jitted(jax.jit(lambda x: x + 1, donate_argnums=0), x)
    assert not x.is_deleted()  # refused before any run


def test_statistics_of_a_hand_made_timing():
    t = Timing("t", 1.0, [7.0, 1.0, 10.0, 3.0, 5.0, 2.0, 9.0, 4.0, 6.0, 8.0], flops=11.0, bytes_accessed=None)
    assert t.median_s == 5.5
    assert t.p10_s == pytest.approx(1.9) and t.p90_s == pytest.approx(9.1)  # linear interpolation
    assert t.spread == pytest.approx((9.1 - 1.9) / 5.5)
    assert t.flops_per_s == pytest.approx(2.0) and t.bytes_per_s is None
    row = t.row()
    assert row["median_ms"] == pytest.approx(5500.0) and row["runs"] == 10 and row["gb_per_s"] is None


def test_utilization_is_the_fraction_of_the_ceiling():
    t = Timing("t", 0.0, [2.0], flops=100.0, bytes_accessed=60.0)  # 50 flop/s, 30 B/s
    c = Ceiling(matmul_flops_per_s=200.0, copy_bytes_per_s=120.0, matmul_n=1, copy_mib=1)
    assert t.utilization(c) == {"flops_frac": 0.25, "bytes_frac": 0.25}
    assert Timing("u", 0.0, [1.0], None, None).utilization(c) == {"flops_frac": None, "bytes_frac": None}
    assert t.row(c)["flops_frac"] == 0.25


class _FakeCompiled:
    def __init__(self, analysis):
        self.analysis = analysis

    def cost_analysis(self):
        if isinstance(self.analysis, Exception):
            raise self.analysis
        return self.analysis


@pytest.mark.parametrize("analysis, expected", [
    ({"flops": 4.0, "bytes accessed": 8.0, "utilization0{}": 1.0}, (4.0, 8.0)),
    ([{"flops": 4.0, "bytes accessed": 8.0}, {"flops": 1.0}], (5.0, 8.0)),  # one dict per program: summed
    ({"bytes accessed": 8.0}, (None, 8.0)),  # e.g. XLA drops "flops" for x * 1.0, a pure copy
    (None, (None, None)),
    ([], (None, None)),
    (NotImplementedError("no cost model"), (None, None)),
])
def test_cost_analysis_shapes(analysis, expected):
    assert _cost(_FakeCompiled(analysis)) == expected


def test_measure_ceiling_small_and_consistent_with_a_timed_matmul():
    c = measure_ceiling(matmul_n=128, copy_mib=4, iters=3)
    assert c.matmul_n == 128 and c.copy_mib == 4
    for rate in (c.matmul_flops_per_s, c.copy_bytes_per_s):
        assert math.isfinite(rate) and rate > 0
    t = time_jitted(jnp.matmul, jnp.ones((128, 128)), jnp.ones((128, 128)), iters=3)
    assert t.utilization(c)["flops_frac"] == pytest.approx(2 * 128**3 / t.median_s / c.matmul_flops_per_s)


def test_format_table():
    table = format_table([{"name": "a", "ms": 1.23456, "n": 3}, {"name": "b", "ms": None, "extra": 2.0}])
    assert table.splitlines() == [
        "| name | ms | n | extra |",
        "|---|---|---|---|",
        "| a | 1.235 | 3 |  |",
        "| b |  |  | 2 |",
    ]
