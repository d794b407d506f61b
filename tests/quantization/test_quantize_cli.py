"""`jaxllm quantize` end to end on tiny random models: files, config, tensor names and shapes, and how far the
dequantized weights (or, where AWQ folded scales into them, the layer outputs) are from the originals."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

from jaxllm.entrypoints.cli import main
from jaxllm.loaders import load_host_model
from jaxllm.quantization.awq_format import unpack_awq
from jaxllm.quantization.calibration import HELD_OUT_TEXT
from jaxllm.quantization.checkpoint import read_dequantized
from jaxllm.quantization.dense_forward import embed_tokens, global_weights, layer_output, split_layers
from tests.tiny_models import AWQ_GROUP

GROUP = AWQ_GROUP
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None}
LINEARS = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
           "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}


def quantize(source, out, *flags) -> int:
    return main(["quantize", str(source), str(out), "--group-size", str(GROUP), "--max-calibration-tokens", "1024",
                 *flags])


def read_tensors(directory) -> dict[str, np.ndarray]:
    with safe_open(str(directory / "model.safetensors"), framework="numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def expected_tensors(hf: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor the checkpoint must hold, from the HF config alone."""
    h, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    d = hf.get("head_dim") or h // hf["num_attention_heads"]
    q, kv = hf["num_attention_heads"] * d, hf["num_key_value_heads"] * d
    sizes = {"wq": (h, q), "wk": (h, kv), "wv": (h, kv), "wo": (q, h), "w_gate": (h, f), "w_up": (h, f),
             "w_down": (f, h)}  # (K, N)
    out = {"model.embed_tokens.weight": ((v, h), "float16"), "model.norm.weight": ((h,), "float16")}
    if not hf.get("tie_word_embeddings", False):
        out["lm_head.weight"] = ((v, h), "float16")
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((h,), "float16")
        out[p + "post_attention_layernorm.weight"] = ((h,), "float16")
        for field, name in LINEARS.items():
            k, n = sizes[field]
            out.update({f"{p}{name}.qweight": ((k, n // 8), "int32"),
                        f"{p}{name}.qzeros": ((k // GROUP, n // 8), "int32"),
                        f"{p}{name}.scales": ((k // GROUP, n), "float16")})
        if hf["model_type"] == "qwen2":
            out.update({p + "self_attn.q_proj.bias": ((q,), "float16"), p + "self_attn.k_proj.bias": ((kv,), "float16"),
                        p + "self_attn.v_proj.bias": ((kv,), "float16")})
    return out


def check_checkpoint(source, out) -> dict:
    """Files, config.json, generation_config.json, the tokenizer and every tensor's name, shape and dtype."""
    from transformers import AutoTokenizer

    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    src_hf, hf = json.loads((source / "config.json").read_text()), json.loads((out / "config.json").read_text())
    assert hf["quantization_config"] == AWQ_CONFIG and hf["torch_dtype"] == "float16"
    ignore = {"quantization_config", "torch_dtype", "dtype"}
    assert {k: v for k, v in hf.items() if k not in ignore} == {k: v for k, v in src_hf.items() if k not in ignore}
    if (source / "generation_config.json").is_file():
        assert json.loads((out / "generation_config.json").read_text()) == \
            json.loads((source / "generation_config.json").read_text())
    text = "Quantized models still read text: 123!"
    encode = [AutoTokenizer.from_pretrained(str(d)).encode(text) for d in (out, source)]
    assert encode[0] == encode[1]
    tensors = read_tensors(out)
    assert {n: (t.shape, str(t.dtype)) for n, t in tensors.items()} == expected_tensors(hf)
    return tensors


def group_steps(tensors: dict, layer: int, field: str) -> np.ndarray:
    """The quantization step of every weight, in the HF [N, K] layout."""
    base = f"model.layers.{layer}.{LINEARS[field]}."
    _, _, scales = unpack_awq(tensors[base + "qweight"], tensors[base + "qzeros"], tensors[base + "scales"], GROUP)
    return np.repeat(scales.astype(np.float32), GROUP, axis=0).T  # [N, K]


@pytest.mark.parametrize("arch", ["llama2", "qwen2"])
def test_rtn_weights_within_one_step(arch, quantizable_model, tmp_path):
    source, _ = quantizable_model(arch)
    out = tmp_path / "rtn"
    assert quantize(source, out, "--method", "rtn") == 0
    tensors = check_checkpoint(source, out)
    loaded = load_host_model(source, "float32")
    original = split_layers(loaded.params, loaded.config)
    _, glob, layers = read_dequantized(out)
    for i, (w, wq) in enumerate(zip(original, layers)):
        for field in LINEARS:
            assert (np.abs(wq[field] - w[field]) <= group_steps(tensors, i, field) * (1 + 1e-3)).all(), (i, field)
        for field in set(w) - set(LINEARS):  # norms and biases: stored as fp16
            np.testing.assert_allclose(wq[field], w[field], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(glob["embed"], global_weights(loaded.params)["embed"], rtol=1e-3, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama2", "qwen2", "smollm2"])
def test_awq_checkpoint_and_layer_outputs(arch, quantizable_model, tmp_path, capsys):
    """llama2: MHA (o is scaled, folded into v); qwen2: q/k/v biases, tied; smollm2: GQA 3:1, hidden 48."""
    from transformers import AutoTokenizer

    source, _ = quantizable_model(arch)
    out = tmp_path / "awq"
    assert quantize(source, out) == 0
    assert f"wrote AWQ int4 (group size {GROUP})" in capsys.readouterr().out
    tensors = check_checkpoint(source, out)
    loaded = load_host_model(source, "float32")
    config, original = loaded.config, split_layers(loaded.params, loaded.config)
    rtn_out = tmp_path / "rtn"
    assert quantize(source, rtn_out, "--method", "rtn") == 0
    _, _, awq_layers = read_dequantized(out)
    _, _, rtn_layers = read_dequantized(rtn_out)
    for i, (w, wq) in enumerate(zip(original, awq_layers)):
        # q and k are scaled (columns) and never clipped: undo the scale read off the folded norm weight
        s = w["attn_norm"] / wq["attn_norm"]  # [H]
        for field in ("wq", "wk"):
            step = group_steps(tensors, i, field) / s
            assert (np.abs(wq[field] / s - w[field]) <= step * 1.001 + 2e-3 * np.abs(w[field])).all(), (i, field)
    # elsewhere the scales were folded into other tensors (and clipping may move a weight further than a step):
    # each layer's output on the float model's own inputs (text the calibration did not see) stays close, and no
    # worse than round-to-nearest's (measured: 0.55 to 0.95 of it)
    text = HELD_OUT_TEXT.read_text(encoding="utf-8")
    tokens = jnp.asarray(AutoTokenizer.from_pretrained(str(out)).encode(text)[:256], jnp.int32).reshape(2, 128)
    x = embed_tokens(global_weights(loaded.params)["embed"], tokens)
    for w, wq, wr in zip(original, awq_layers, rtn_layers):
        ref = layer_output(w, x, config)
        change = np.linalg.norm(ref - x)  # what the layer adds to the residual stream
        awq_err, rtn_err = (np.linalg.norm(layer_output(v, x, config) - ref) / change for v in (wq, wr))
        assert awq_err < 0.25 and awq_err < 1.05 * rtn_err, (awq_err, rtn_err)
        x = ref
