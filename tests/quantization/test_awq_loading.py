"""Loading AutoAWQ GEMM checkpoints: the project's quantizer output loads with its linears packed (AWQWeight), its
logits equal a float model built from the dequantized weights, every tensor agrees with an independent unpacker
and round-trips exactly, and every malformed checkpoint is refused with the file and tensor or key named."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxllm.errors import ModelLoadError
from jaxllm.loaders import load_host_model, load_model
from jaxllm.loaders.assemble import assemble_params
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.params import LlamaParams
from jaxllm.model.tensor_parallel import qkv_rows, shard_major_params
from jaxllm.quantization.checkpoint import read_dequantized
from pallas_kernels.awq_matmul.layout import AWQPacked, to_awq
from pallas_kernels.awq_matmul.reference import dequantize
from tests.kernels.test_awq_matmul import dense_oracle
from tests.model.test_weight_seam import logits
from tests.quantization.test_quantize_cli import LINEARS, read_tensors
from tests.tiny_models import AWQ_GROUP as GROUP

FUSED = {"w_qkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up"), "wo": ("wo",), "w_down": ("w_down",)}


def dequantized_params(directory, config) -> LlamaParams:
    """A float32 model of the checkpoint's dequantized weights, through the quantizer's own reader."""
    _, glob, layers = read_dequantized(directory)
    tensors = [(f, None, f, a) for f, a in glob.items() if not (f == "lm_head" and config.tie_word_embeddings)]
    tensors += [(f, i, f, a) for i, layer in enumerate(layers) for f, a in layer.items()]
    return assemble_params(config, tensors, source="dequantized")


def copy_checkpoint(source, target, edit_config=None, edit_tensors=None):
    """A copy of an AWQ checkpoint with its config.json dict and/or its tensors dict edited in place."""
    shutil.copytree(source, target)
    if edit_config is not None:
        hf = json.loads((target / "config.json").read_text())
        edit_config(hf)
        (target / "config.json").write_text(json.dumps(hf))
    if edit_tensors is not None:
        tensors = read_tensors(target)
        edit_tensors(tensors)
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


# ---------------------------------------------------------------------------------------------- loading


@pytest.mark.slow
@pytest.mark.parametrize("arch,method", [("llama3", "awq"), ("qwen2", "rtn"), ("smollm2", "rtn")])
def test_logits_equal_the_float_model_of_the_dequantized_weights(awq_model_dir, arch, method):
    directory = awq_model_dir(arch, method)
    loaded = load_model(directory)
    linears = [getattr(layer, f) for layer in loaded.params.layers for f in FUSED]
    assert all(isinstance(w, AWQWeight) and w.qweight.dtype == np.int32 for w in linears)
    assert loaded.params.embed.dtype == np.float32  # dense tensors in the requested (CPU: float32) dtype
    want = logits(loaded.config, dequantized_params(directory, loaded.config))
    got = logits(loaded.config, loaded.params)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert np.abs(want).max() > 0.1  # the comparison is not between near-zero logits


@pytest.mark.slow
@pytest.mark.parametrize("dtype, scales", [("float32", np.float16), ("bfloat16", "bfloat16"),
                                           ("float16", np.float16)])
def test_scales_are_held_in_the_activations_dtype_when_it_is_16_bit(awq_model_dir, dtype, scales):
    """bf16 activations meet bf16 scales (the kernel's int4 -> bf16 path); float32 keeps the checkpoint's fp16. The
    bf16 model's logits stay within bf16 rounding of the float32 model's."""
    directory = awq_model_dir("llama3")
    loaded = load_host_model(directory, dtype)
    assert {getattr(layer, f).scales.dtype for layer in loaded.params.layers for f in FUSED} == {np.dtype(scales)}
    if dtype == "bfloat16":
        float_model = load_host_model(directory, "float32")
        want = logits(float_model.config, jax.tree.map(jax.numpy.asarray, float_model.params))
        got = logits(loaded.config, jax.tree.map(jax.numpy.asarray, loaded.params))
        np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.abs(want).max())


@pytest.mark.slow
def test_every_linear_agrees_with_an_independent_unpacker(awq_model_dir):
    """The loaded (repacked, fused) weights dequantize to exactly the oracle's W of each file tensor."""
    directory = awq_model_dir("llama3")
    params = load_host_model(directory).params
    tensors = read_tensors(directory)
    for layer in range(2):
        for fused, parts in FUSED.items():
            want = np.concatenate([dense_oracle(*[tensors[f"model.layers.{layer}.{LINEARS[p]}.{t}"]
                                                  for t in ("qweight", "qzeros", "scales")], GROUP)
                                   for p in parts], axis=1)  # [K, N fused]
            weight = getattr(params.layers[layer], fused)
            assert weight.shape == (want.shape[1], want.shape[0])  # stands for the dense [N, K]
            np.testing.assert_array_equal(np.asarray(dequantize(weight.packed)), want.astype(np.float32))


def test_pack_write_load_round_trips_exactly(awq_model_dir):
    directory = awq_model_dir("qwen2")
    params = load_host_model(directory).params
    tensors = read_tensors(directory)
    for fused, parts in FUSED.items():
        weight = getattr(params.layers[1], fused)
        start = 0
        for part in parts:
            base = f"model.layers.1.{LINEARS[part]}"
            n = tensors[base + ".scales"].shape[1]
            one = AWQPacked(*(np.asarray(leaf[..., start:start + n]) for leaf in jax.tree.leaves(weight)))
            for got, name in zip(to_awq(one), ("qweight", "qzeros", "scales")):
                np.testing.assert_array_equal(got, tensors[f"{base}.{name}"])
                assert got.dtype == tensors[f"{base}.{name}"].dtype
            start += n


def test_tensor_parallel_layout_selects_packed_columns(awq_model_dir):
    """The shard-major layout of the fused q|k|v is the same column selection for packed and dequantized weights."""
    directory = awq_model_dir("llama3")
    loaded = load_host_model(directory)
    config, tp = loaded.config, 2
    packed = shard_major_params(loaded.params, config, tp).layers[0].w_qkv
    dense = dequantized_params(directory, config).layers[0].w_qkv  # [N, K]
    np.testing.assert_array_equal(np.asarray(dequantize(packed.packed)), dense[qkv_rows(config, tp)].T)


@pytest.mark.slow
def test_quantization_awq_is_accepted_and_modules_to_not_convert_stay_dense(awq_model_dir, tmp_path):
    """down_proj listed in modules_to_not_convert and stored dense: it loads as an array, the rest packed, and the
    logits still equal the float model's."""
    source = awq_model_dir("llama3")

    def dense_down(tensors):
        for layer in range(2):
            base = f"model.layers.{layer}.mlp.down_proj"
            w = dense_oracle(*(tensors.pop(f"{base}.{t}") for t in ("qweight", "qzeros", "scales")), GROUP)
            tensors[f"{base}.weight"] = np.ascontiguousarray(w.T.astype(np.float32))  # exact

    directory = copy_checkpoint(source, tmp_path / "m", lambda hf: hf["quantization_config"].update(
        modules_to_not_convert=["down_proj"]), dense_down)
    loaded = load_model(directory, quantization="awq")
    assert all(isinstance(layer.w_qkv, AWQWeight) and isinstance(layer.w_down, jax.Array)
               for layer in loaded.params.layers)
    want = logits(loaded.config, dequantized_params(source, loaded.config))
    np.testing.assert_allclose(logits(loaded.config, loaded.params), want, rtol=0, atol=1e-4)


def test_older_autoawq_config_keys_are_read(awq_model_dir, tmp_path):
    def old_keys(hf):
        config = hf["quantization_config"]
        config["w_bit"], config["q_group_size"] = config.pop("bits"), config.pop("group_size")

    directory = copy_checkpoint(awq_model_dir("llama3"), tmp_path / "m", old_keys)
    assert all(isinstance(layer.wo, AWQWeight) for layer in load_host_model(directory).params.layers)


# ---------------------------------------------------------------------------------------------- refusals


def _set(key, value):
    return lambda hf: hf["quantization_config"].update({key: value})


CONFIG_REFUSALS = {
    "gemv": (_set("version", "gemv"), "quantization_config.version 'gemv' is not supported"),
    "bits": (_set("bits", 8), "quantization_config.bits is 8: only 4-bit"),
    "zero_point": (_set("zero_point", False), "quantization_config.zero_point must be true"),
    "group_size": (_set("group_size", 12), "quantization_config.group_size must be a positive multiple of 8"),
    "per_channel": (_set("group_size", -1), "quantization_config.group_size must be a positive multiple of 8"),
    "method": (_set("quant_method", "gptq"), "quantization_config.quant_method 'gptq' is not supported"),
    "skip_list": (_set("modules_to_not_convert", "lm_head"),
                  "quantization_config.modules_to_not_convert must be a list"),
    "not_a_dict": (lambda hf: hf.update(quantization_config=4), "quantization_config must be an object"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_unsupported_quantization_configs_are_refused(awq_model_dir, tmp_path, case):
    edit, message = CONFIG_REFUSALS[case]
    directory = copy_checkpoint(awq_model_dir("llama3"), tmp_path / "m", edit)
    with pytest.raises(ModelLoadError, match="config.json: " + message):
        load_host_model(directory)


Q = "model.layers.1.self_attn.q_proj"


def _pop(name):
    return lambda tensors: tensors.pop(name)


def _replace(name, make):
    return lambda tensors: tensors.update({name: make(tensors[name])})


TENSOR_REFUSALS = {
    "missing_qzeros": (_pop(Q + ".qzeros"), f"AWQ linear '{Q}' has no qzeros tensor"),
    "missing_all": (lambda t: [t.pop(f"{Q}.{p}") for p in ("qweight", "qzeros", "scales")],
                    "missing tensors: layer 1 wq"),
    "qweight_dtype": (_replace(Q + ".qweight", lambda a: a.astype(np.float32)),
                      f"tensor '{Q}.qweight' is float32, AWQ packs int4 into int32"),
    "scales_dtype": (_replace(Q + ".scales", lambda a: a.astype(np.int32)), f"tensor '{Q}.scales' is int32"),
    "scales_shape": (_replace(Q + ".scales", lambda a: a[:, :-8]), f"tensor '{Q}.scales' has shape"),
    "qzeros_shape": (_replace(Q + ".qzeros", lambda a: a[:-1]), f"tensor '{Q}.qzeros' has shape"),
    "qweight_rows": (_replace(Q + ".qweight", lambda a: a[:-1]), f"tensor '{Q}.qweight' has shape"),
    "wrong_size": (lambda t: [t.update({f"{Q}.{p}": t[f"{Q.replace('q_proj', 'k_proj')}.{p}"]})
                              for p in ("qweight", "qzeros", "scales")],
                   f"tensor '{Q}.qweight' has shape \\(32, 64\\), but the config implies \\(64, 64\\)"),
    "dense_linear": (lambda t: t.update({Q + ".weight": np.zeros((64, 64), np.float16)}),
                     f"tensor '{Q}.weight' is a dense weight in an AWQ checkpoint"),
}


@pytest.mark.parametrize("case", sorted(TENSOR_REFUSALS))
def test_malformed_awq_tensors_are_refused_by_name(awq_model_dir, tmp_path, case):
    edit, message = TENSOR_REFUSALS[case]
    directory = copy_checkpoint(awq_model_dir("llama3"), tmp_path / "m", edit_tensors=edit)
    with pytest.raises(ModelLoadError, match=message):
        load_host_model(directory)


def test_a_quantized_module_that_modules_to_not_convert_lists_is_refused(awq_model_dir, tmp_path):
    directory = copy_checkpoint(awq_model_dir("llama3"), tmp_path / "m", _set("modules_to_not_convert", ["q_proj"]))
    with pytest.raises(ModelLoadError, match="model.safetensors: tensor 'model.layers.0.self_attn.q_proj.q"
                                             ".*modules_to_not_convert lists this module"):
        load_host_model(directory)


def test_fused_projections_must_be_quantized_alike(awq_model_dir, tmp_path):
    """q dense, k and v packed: q|k|v cannot be one fused weight."""
    def dense_q(tensors):
        for layer in range(2):
            base = f"model.layers.{layer}.self_attn.q_proj"
            w = dense_oracle(*(tensors.pop(f"{base}.{t}") for t in ("qweight", "qzeros", "scales")), GROUP)
            tensors[f"{base}.weight"] = np.ascontiguousarray(w.T.astype(np.float16))

    directory = copy_checkpoint(awq_model_dir("llama3"), tmp_path / "m", _set("modules_to_not_convert", ["q_proj"]),
                                dense_q)
    with pytest.raises(ModelLoadError, match="cannot fuse weights of different formats: AWQWeight, dense"):
        load_host_model(directory)


def test_quantization_awq_needs_an_awq_checkpoint(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="config.json: quantization='awq' was asked for, but there is no "
                                             "quantization_config"):
        load_host_model(tiny_model_dir("llama3")[0], quantization="awq")
    with pytest.raises(ValueError, match="quantization must be one of awq \\(or unset\\), got 'gptq'"):
        load_host_model(tiny_model_dir("llama3")[0], quantization="gptq")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="quantization='awq' reads AutoAWQ checkpoints.*this is a gguf model"):
        load_host_model(gguf, quantization="awq")


def test_packed_params_are_not_saved_as_jaxllm_awq_model_dir(awq_model_dir, tmp_path):
    from jaxllm.loaders import save_checkpoint

    loaded = load_host_model(awq_model_dir("llama3"))
    with pytest.raises(ValueError, match="cannot save AWQWeight weights"):
        save_checkpoint(tmp_path / "ckpt", loaded.config, loaded.params)


def test_checkpoint_tensors_are_what_the_tests_assume(awq_model_dir):
    """The tiny AWQ checkpoints hold every linear packed, q_proj [64 -> 64] at group size GROUP."""
    with safe_open(str(awq_model_dir("llama3") / "model.safetensors"), framework="numpy") as f:
        assert f.get_tensor(Q + ".qweight").shape == (64, 8) and f.get_tensor(Q + ".scales").shape == (64 // GROUP, 64)


# ---------------------------------------------------------------------------------------------- the engine


def write_dequantized_hf_dir(source, target):
    """A float32 Hugging Face directory of an AWQ checkpoint's dequantized weights, config without
    quantization_config, tokenizer files copied: what an unquantized model of the same weights looks like."""
    from jaxllm.config import ModelConfig
    from jaxllm.quantization.checkpoint import GLOBAL_NAMES, LINEAR_NAMES, dense_layer_names

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors"))
    hf, glob, layers = read_dequantized(source)
    dense_names = dense_layer_names(ModelConfig.from_hf_config(hf))
    del hf["quantization_config"]
    (target / "config.json").write_text(json.dumps(hf))
    tensors = {GLOBAL_NAMES[f]: a for f, a in glob.items()}
    for i, layer in enumerate(layers):
        names = {**dense_names, **{f: f"{n}.weight" for f, n in LINEAR_NAMES.items()}}
        tensors.update({f"model.layers.{i}.{names[f]}": np.ascontiguousarray(a) for f, a in layer.items()})
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


@pytest.mark.slow
def test_llm_generates_the_float_models_greedy_tokens(awq_model_dir, tmp_path):
    from jaxllm import LLM, SamplingParams

    awq_dir = awq_model_dir("llama3", "awq")
    dense_dir = write_dequantized_hf_dir(awq_dir, tmp_path / "dense")
    prompts = ["The quick brown fox", "int4 weights", "a"]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    common = dict(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32)
    got = LLM(str(awq_dir), quantization="awq", **common).generate(prompts, params)
    want = LLM(str(dense_dir), **common).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len({tuple(o.outputs[0].token_ids) for o in got}) == len(prompts)  # not one degenerate sequence


def test_quantization_is_an_engine_argument_and_a_flag():
    from jaxllm.engine.args import EngineArgs
    from jaxllm.entrypoints.cli import build_parser

    for command in (["serve"], ["generate", "hi"]):
        assert build_parser().parse_args([*command, "--quantization", "awq"]).quantization == "awq"
    with pytest.raises(ValueError, match="quantization must be one of awq \\(or unset\\), got 'int8'"):
        EngineArgs(quantization="int8")


def test_rtn_params_in_memory_dequantize_to_the_fake_quantized_weights():
    from jaxllm.config import ModelConfig
    from jaxllm.model import random_params
    from jaxllm.quantization.group_quant import fake_quantize
    from jaxllm.quantization.rtn_params import rtn_awq_params

    config = ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16)
    dense = random_params(config, jax.random.key(1), scale=0.1)
    packed = rtn_awq_params(dense, GROUP)
    for dense_layer, packed_layer in zip(dense.layers, packed.layers, strict=True):
        for field in FUSED:
            w = getattr(dense_layer, field)  # [N, K]
            got = dequantize(getattr(packed_layer, field).packed)  # [K, N]
            np.testing.assert_array_equal(np.asarray(got), np.asarray(fake_quantize(w, GROUP)).T)
