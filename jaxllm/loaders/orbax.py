"""Orbax checkpoints of converted params: convert once (from GGUF or safetensors), reload fast.

Layout of a checkpoint directory:
    jaxllm_checkpoint.json   {"format_version", "config", "dtype"}
    params/                  the LlamaParams pytree, written by orbax
    tokenizer/               the tokenizer, when one was saved with the params
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.architecture import ARCHITECTURES
from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import REQUIRED, FieldReader, read_json, short_repr
from jaxllm.loaders.assemble import DTYPES, numpy_dtype
from jaxllm.loaders.host_memory import check_fits_host
from jaxllm.loaders.weight_checks import all_finite
from jaxllm.loaders.resolve import ORBAX_MARKER
from jaxllm.model.params import LlamaParams, abstract_params, params_dtype
from jaxllm.model.weights import WeightFormat
from jaxllm.rope_scaling import read_rope_scaling

FORMAT_VERSION = 2  # 2: each layer's arrays apart (1 stacked them on a leading [L] axis)


def save_checkpoint(path: str | Path, config: ModelConfig, params: LlamaParams, tokenizer=None) -> Path:
    path = Path(path).absolute()
    packed = sorted({type(w).__name__ for layer in params.layers for w in vars(layer).values()
                     if isinstance(w, WeightFormat)})
    if packed:
        raise ValueError(f"cannot save {', '.join(packed)} weights: jaxllm checkpoints hold dense weights (keep "
                         "the quantized model's own directory, which loads as fast)")
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path}: refusing to overwrite a non-empty directory")
    dtype = str(params_dtype(params))
    ocp = _orbax()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "params", params)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path / "tokenizer"))
    meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(config), "dtype": dtype}
    (path / ORBAX_MARKER).write_text(json.dumps(meta, indent=1))
    return path


def read_checkpoint_config(path: Path) -> tuple[ModelConfig, str]:
    """The checkpoint's ModelConfig and saved dtype, from its description, every field checked as it is read."""
    marker = path / ORBAX_MARKER
    try:
        meta = FieldReader(read_json(marker), marker)
    except ModelLoadError as e:
        raise ModelLoadError(marker, f"not a valid jaxllm checkpoint description ({e.problem})") from e
    version = meta.raw("format_version", None)
    if version != FORMAT_VERSION:
        raise ModelLoadError(marker, f"format_version {short_repr(version)} is not {FORMAT_VERSION}: this checkpoint "
                             "was written by another jaxllm version (1 stacked the layers); save it again from the "
                             "original model")
    return _config(meta.section("config", REQUIRED)), meta.text("dtype", choices=DTYPES)


def load_checkpoint(path: Path, dtype: str | None = None, shardings: Any = None) -> tuple[ModelConfig, LlamaParams]:
    """Restore params cast to `dtype` (None: as saved). Without `shardings` they come back as numpy arrays on the
    host, for loaders.place_model to put on their devices (split over a mesh, each device gets only its part: the
    saved ordinary layout is not the tensor-parallel one, so it cannot be read straight into it); `shardings` (a
    LlamaParams of jax.sharding.Sharding) places each array as it is read instead.

    Before anything is read, the description's config must fit in host memory and describe exactly the saved
    arrays (names and shapes, from orbax's metadata); each restored array must be finite."""
    path = Path(path).absolute()
    config, saved_dtype = read_checkpoint_config(path)
    np_dtype = numpy_dtype(dtype or saved_dtype)
    check_fits_host(config, path / ORBAX_MARKER, np.dtype(np_dtype).itemsize)
    target = abstract_params(config, np_dtype)
    saved = _saved_shapes(path)
    if saved is not None:  # before anything is read
        _check_shapes(path / ORBAX_MARKER, _shapes(target), saved)
    if shardings is not None:
        target = jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                        target, shardings)
    try:
        params = _restore(path / "params", target, to_host=shardings is None)
    except Exception as e:
        raise ModelLoadError(path / "params", f"cannot restore params: {e}") from e
    _check_shapes(path / ORBAX_MARKER, _shapes(target), _shapes(params))  # what was read, whatever the metadata
    for name, array in _named_leaves(params):
        if not (all_finite(array) if isinstance(array, np.ndarray) else bool(jnp.isfinite(array).all())):
            raise ModelLoadError(path / "params", f"tensor {name!r} holds NaN or infinite values")
    return config, params


def _restore(path: Path, target: LlamaParams, to_host: bool) -> LlamaParams:
    """The saved pytree with target's dtypes (orbax casts each array as it reads it): numpy arrays (to_host), or
    device arrays with target's shardings."""
    ocp = _orbax()
    if not to_host:
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(path, target)
    restore_args = jax.tree_util.tree_map(lambda s: ocp.RestoreArgs(restore_type=np.ndarray, dtype=s.dtype), target)
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(path, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))


def _saved_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of each array saved in params/, from orbax's metadata (nothing is read); None when this
    orbax version's metadata does not have that form, or cannot be read (restoring then says what is wrong)."""
    ocp = _orbax()
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            metadata = checkpointer.metadata(path / "params")
        tree = getattr(metadata, "item_metadata", metadata)  # newer orbax wraps the tree in step metadata
        return _shapes(getattr(tree, "tree", tree))
    except Exception:
        return None


def _check_shapes(marker: Path, wanted: dict[str, tuple], saved: dict[str, tuple]) -> None:
    """ModelLoadError naming the description when its config implies other arrays than params/ holds."""
    for names, what in ((wanted.keys() - saved.keys(), "implies arrays that params/ lacks"),
                        (saved.keys() - wanted.keys(), "does not describe the saved arrays")):
        if names:
            raise ModelLoadError(marker, f"its config {what}: {', '.join(sorted(names)[:4])}"
                                 + (f" and {len(names) - 4} more" if len(names) > 4 else ""))
    wrong = [name for name in wanted if wanted[name] != saved[name]]
    if wrong:
        raise ModelLoadError(marker, f"its config implies {wrong[0]} of shape {wanted[wrong[0]]}, but params/ holds "
                             f"{saved[wrong[0]]}" + (f" ({len(wrong)} arrays disagree)" if len(wrong) > 1 else ""))


def _shapes(tree) -> dict[str, tuple[int, ...]]:
    return {name: tuple(leaf.shape) for name, leaf in _named_leaves(tree)}


def _named_leaves(tree) -> list[tuple[str, Any]]:
    """(name such as "layers.0.wo", leaf) of a params pytree or of orbax's metadata tree of it."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(".".join(str(_key_name(k)) for k in keys), leaf) for keys, leaf in leaves]


def _key_name(key) -> Any:
    for attribute in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
        if hasattr(key, attribute):
            return getattr(key, attribute)
    return key


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def _config(c: FieldReader) -> ModelConfig:
    """ModelConfig from the description's "config" (dataclasses.asdict of one), each field checked."""
    c.refuse_unknown(_DEFAULTS)

    def default(name: str) -> Any:
        return REQUIRED if _DEFAULTS[name] is dataclasses.MISSING else _DEFAULTS[name]

    scaling = c.section("rope_scaling")
    head_dim, max_positions = c.integer("head_dim"), c.integer("max_position_embeddings",
                                                                 default("max_position_embeddings"))
    fields = dict(
        architecture=c.text("architecture", choices=set(ARCHITECTURES)),
        **{name: c.integer(name) for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                              "num_heads", "num_kv_heads", "head_dim")},
        rms_norm_eps=c.number("rms_norm_eps", default("rms_norm_eps"), maximum=1.0),
        rope_theta=c.number("rope_theta", default("rope_theta")),
        rope_scaling=None if scaling is None else read_rope_scaling(scaling, head_dim, max_positions),
        max_position_embeddings=max_positions,
        tie_word_embeddings=c.flag("tie_word_embeddings", default("tie_word_embeddings")),
        qkv_bias=c.flag("qkv_bias", default("qkv_bias")),
        sliding_window=c.integer("sliding_window", None),
        layer_types=tuple(c.text_list("layer_types")),
        **{name: c.number(name, None) for name in ("rope_local_theta", "query_pre_attn_scalar",
                                                   "attn_logit_softcap", "final_logit_softcap")},
        bos_token_id=c.integer("bos_token_id", None, minimum=0),
        eos_token_ids=c.token_ids("eos_token_ids"),
        **_expert_fields(c),
    )
    try:
        return ModelConfig(**fields)
    except ValueError as e:
        raise ModelLoadError(c.source, str(e)) from e


def _expert_fields(c: FieldReader) -> dict:
    """A mixture-of-experts model's fields (expert_parallel is the engine's choice, not the checkpoint's)."""
    return dict(**{name: c.integer(name, 0, minimum=0) for name in (
                    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")},
                norm_topk_prob=c.flag("norm_topk_prob", True), dense_layers=c.token_ids("dense_layers"))


def _orbax():
    """orbax.checkpoint, imported where a checkpoint is saved or read: a sixth of a second that other starts skip."""
    import orbax.checkpoint

    return orbax.checkpoint
