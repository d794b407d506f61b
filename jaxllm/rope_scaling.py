"""Rope scaling: the config's rope_scaling (or rope_parameters) section -> a frozen description -> the inverse
frequencies and the cos/sin factor, with the semantics of Hugging Face transformers (modeling_rope_utils).

    type       inverse frequencies (base ** (-2i/D), i < D/2)                      cos/sin factor
    linear     divided by factor                                                   1
    llama3     long wavelengths divided by factor, short kept, a ramp between      1
    dynamic    NTK: base * (factor * S / M - (factor - 1)) ** (D / (D - 2)), S the   1
               sequence length, M max_position_embeddings
    yarn       interpolated (/ factor) below the correction range, extrapolated      attention_factor (default
               above it, a linear ramp between (beta_fast, beta_slow)              0.1 ln(factor) + 1, or mscale's)
    longrope   divided by the per-frequency short_factor or long_factor              attention_factor (default
                                                                                   sqrt(1 + ln(f) / ln(M0)))

A paged engine cannot make the table depend on the batch: a K vector cached at one step is read at later steps,
so every step must rotate with the same table. The two types whose table HF recomputes from the sequence length
are fixed once:
    dynamic    at S = max_position_embeddings, the longest context the engine accepts (EngineArgs refuses a
               longer max_model_len). HF's formula gives the unscaled base there, so every sequence the engine
               runs gets HF's own table (HF scales only past max_position_embeddings).
    longrope   short_factor: HF's choice for every sequence up to original_max_position_embeddings (HF switches the
               whole sequence to long_factor past it; a context longer than that gets the short table here).
Any other type is refused, naming the field.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxllm.file_fields import FieldReader, short_repr

SUPPORTED_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent rope scaling (rope_scaling.rope_type == "llama3")."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def inv_freq(self, base: float, dim: int) -> tuple[np.ndarray, float]:
        inv_freq = default_inv_freq(base, dim)
        # Wavelengths longer than the original context / low_freq_factor are slowed by `factor`, shorter than
        # context / high_freq_factor kept, and the band between interpolated linearly in context / wavelength.
        wavelen = 2 * math.pi / inv_freq
        ratio = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        ratio = np.clip(ratio, 0.0, 1.0)
        return (1 - ratio) * inv_freq / self.factor + ratio * inv_freq, 1.0


@dataclasses.dataclass(frozen=True)
class LinearRopeScaling:
    factor: float
    rope_type: str = "linear"

    def inv_freq(self, base: float, dim: int) -> tuple[np.ndarray, float]:
        return default_inv_freq(base, dim) / self.factor, 1.0


@dataclasses.dataclass(frozen=True)
class DynamicRopeScaling:
    factor: float
    max_position_embeddings: int  # M, and the sequence length the table is fixed at (module docstring)
    rope_type: str = "dynamic"

    def inv_freq(self, base: float, dim: int) -> tuple[np.ndarray, float]:
        seq_len = self.max_position_embeddings
        base = base * ((self.factor * seq_len / self.max_position_embeddings) - (self.factor - 1)) ** (dim / (dim - 2))
        return default_inv_freq(base, dim), 1.0


@dataclasses.dataclass(frozen=True)
class YarnRopeScaling:
    factor: float
    original_max_position_embeddings: int
    attention_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    rope_type: str = "yarn"

    def inv_freq(self, base: float, dim: int) -> tuple[np.ndarray, float]:
        low, high = (self._correction_dim(self.beta_fast, dim, base), self._correction_dim(self.beta_slow, dim, base))
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as HF: no zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)  # [D/2]
        extrapolation = default_inv_freq(base, dim)
        keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
        return extrapolation / self.factor * (1 - keep) + extrapolation * keep, self.attention_factor

    def _correction_dim(self, rotations: float, dim: int, base: float) -> float:
        """The dimension whose wavelength makes `rotations` turns over the original context."""
        return dim * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))


@dataclasses.dataclass(frozen=True)
class LongRopeScaling:
    short_factor: tuple[float, ...]  # [D/2]
    long_factor: tuple[float, ...]  # [D/2] (kept: see the module docstring for which applies)
    original_max_position_embeddings: int
    attention_factor: float
    rope_type: str = "longrope"

    def inv_freq(self, base: float, dim: int) -> tuple[np.ndarray, float]:
        return default_inv_freq(base, dim) / np.asarray(self.short_factor, np.float32), self.attention_factor


RopeScaling = Llama3RopeScaling | LinearRopeScaling | DynamicRopeScaling | YarnRopeScaling | LongRopeScaling


def default_inv_freq(base: float, dim: int) -> np.ndarray:
    """[D/2] float32 base ** (-2i / D)."""
    return (1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(np.float32)


def read_rope_scaling(s: FieldReader, head_dim: int, max_position_embeddings: int,
                      original_max: int | None = None, longrope_aliases: tuple[str, ...] = ("su",)
                      ) -> RopeScaling | None:
    """The scaling a config section describes (None for "default"); every bad value a ModelLoadError naming the
    file and the field. original_max: the config's top-level original_max_position_embeddings (Phi-3 keeps it
    there); longrope_aliases: the type names the family reads as longrope."""
    kind = s.text("rope_type", None) or s.text("type", "default")
    kind = "longrope" if kind in longrope_aliases else kind
    if kind not in SUPPORTED_TYPES:
        field = "rope_type" if s.has("rope_type") else "type"
        raise s.error(field, f"{short_repr(kind)} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
    if s.number("partial_rotary_factor", 1.0, maximum=1.0) != 1.0:
        raise s.error("partial_rotary_factor", "below 1 (rope on part of each head) is not supported")
    if kind == "default":
        return None
    if kind == "linear":
        return LinearRopeScaling(factor=s.number("factor"))
    if kind == "llama3":
        return _llama3(s)
    if kind == "dynamic":
        return DynamicRopeScaling(factor=s.number("factor"), max_position_embeddings=max_position_embeddings)
    original = s.integer("original_max_position_embeddings", original_max)
    if original is None:
        raise s.error("original_max_position_embeddings", f"is required by rope type {kind!r}")
    if kind == "yarn":
        return _yarn(s, original, max_position_embeddings)
    return _longrope(s, original, head_dim, max_position_embeddings)


def _llama3(s: FieldReader) -> Llama3RopeScaling:
    low = s.number("low_freq_factor")
    high = s.number("high_freq_factor")
    if high <= low:
        raise s.error("high_freq_factor", f"must be above low_freq_factor ({low}), got {high}")
    return Llama3RopeScaling(factor=s.number("factor"), low_freq_factor=low, high_freq_factor=high,
                             original_max_position_embeddings=s.integer("original_max_position_embeddings"))


def _yarn(s: FieldReader, original: int, max_position_embeddings: int) -> YarnRopeScaling:
    factor = s.number("factor", max_position_embeddings / original)
    attention_factor = s.number("attention_factor", None)
    if attention_factor is None:
        mscale, mscale_all_dim = s.number("mscale", None), s.number("mscale_all_dim", None)
        attention_factor = (_mscale(factor, mscale) / _mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                            else _mscale(factor, 1.0))
    truncate = s.flag("truncate", True)
    return YarnRopeScaling(factor=factor, original_max_position_embeddings=original,
                           attention_factor=attention_factor, beta_fast=s.number("beta_fast", 32.0),
                           beta_slow=s.number("beta_slow", 1.0), truncate=truncate)


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _longrope(s: FieldReader, original: int, head_dim: int, max_position_embeddings: int) -> LongRopeScaling:
    factors = {key: _factor_list(s, key, head_dim // 2) for key in ("short_factor", "long_factor")}
    attention_factor = s.number("attention_factor", None)
    if attention_factor is None:
        factor = s.number("factor", max_position_embeddings / original)
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return LongRopeScaling(**factors, original_max_position_embeddings=original, attention_factor=attention_factor)


def _factor_list(s: FieldReader, key: str, size: int) -> tuple[float, ...]:
    values = s.raw(key)
    if (not isinstance(values, (list, tuple)) or len(values) != size
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in values)):
        raise s.error(key, f"must be a list of {size} positive numbers (head_dim / 2), got {short_repr(values)}")
    return tuple(float(v) for v in values)
