"""AutoAWQ checkpoints of mixture-of-experts models (tests/quantization/awq_moe_checkpoint.py writes them): every
expert's projections load as int4 stacks (AWQWeight with a leading [E] axis, gate|up fused per expert), Qwen2-MoE's
shared expert as a dense layer's int4 MLP, the routers dense; the logits equal those of the float32 model of the
dequantized weights with moe "reference" and "cpu" (and "pallas" in interpret mode), and so do the engine's greedy
tokens; tensor and expert
parallelism give the one-device logits; what cannot work is refused by name."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxllm import LLM, ModelLoadError, SamplingParams, load_model
from jaxllm.engine import engine as engine_module
from jaxllm.model import init_kv_cache, jit_forward
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.kernels import Kernels
from jaxllm.model.moe import expert_stack
from pallas_kernels.awq_matmul.reference import dequantize
from tests.model.test_families_tensor_parallel import logits_at
from tests.model.test_tensor_parallel import LOGITS_TOLERANCE
from tests.model.test_weight_seam import batch
from tests.quantization.awq_moe_checkpoint import write_awq_moe

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")
GROUP = 16
NOT_CONVERT = {"mixtral": ["gate"]}  # what AutoAWQ writes for Mixtral: its router stays dense
PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 190, 33, 2], [200, 1, 2, 3, 4, 120]]


@pytest.fixture(scope="session")
def awq_moe(tiny_model_dir, tmp_path_factory):
    """(family, group size) -> (AutoAWQ checkpoint directory, float32 directory of its dequantized weights)."""
    cache = {}

    def get(family: str, group_size: int = GROUP):
        if (family, group_size) not in cache:
            root = tmp_path_factory.mktemp(f"awq-{family}-g{group_size}")
            cache[family, group_size] = write_awq_moe(tiny_model_dir(family)[0], root / "awq", root / "dense",
                                                      group_size, NOT_CONVERT.get(family))
        return cache[family, group_size]

    return get


def _logits(config, params, moe: str) -> np.ndarray:
    out, _ = jit_forward(config, Kernels(moe=moe))(params, init_kv_cache(config, 6, 4), batch())
    return np.asarray(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_load_as_int4_stacks_of_the_checkpoint_weights(family, awq_moe):
    awq_dir, dense_dir = awq_moe(family)
    loaded, dense = load_model(awq_dir), load_model(dense_dir)
    config = loaded.config
    e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    sparse = [n for n in range(config.num_layers) if config.is_moe_layer(n)]
    assert sparse
    for n in sparse:
        layer, want = loaded.params.layers[n], dense.params.layers[n]
        gate_up, down = layer.w_experts_gate_up, layer.w_experts_down
        assert isinstance(gate_up, AWQWeight) and isinstance(down, AWQWeight)
        assert gate_up.qweight.shape == (e, h // 8, 2 * i) and gate_up.scales.shape == (e, h // GROUP, 2 * i)
        assert down.qweight.shape == (e, i // 8, h) and gate_up.shape == (e, 2 * i, h) and down.shape == (e, h, i)
        assert not isinstance(layer.router, AWQWeight)
        np.testing.assert_array_equal(np.asarray(layer.router), np.asarray(want.router))
        for stack, field in ((gate_up, "w_experts_gate_up"), (down, "w_experts_down")):
            for expert in (0, e - 1):
                one = dequantize(jax.tree.map(lambda leaf: leaf[expert], expert_stack(stack)))  # [K, N]
                np.testing.assert_array_equal(np.asarray(one).T, np.asarray(getattr(want, field)[expert]))
        if config.arch.shared_expert:
            assert isinstance(layer.w_shared_gate_up, AWQWeight) and isinstance(layer.w_shared_down, AWQWeight)
            assert not isinstance(layer.shared_gate, AWQWeight)


@pytest.mark.parametrize("moe", ["reference", "cpu"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_the_float_model_of_the_dequantized_weights(family, moe, awq_moe):
    awq_dir, dense_dir = awq_moe(family)
    loaded, dense = load_model(awq_dir), load_model(dense_dir)
    want = _logits(dense.config, dense.params, "reference")
    np.testing.assert_allclose(_logits(loaded.config, loaded.params, moe), want, rtol=0, atol=1e-4)
    assert np.abs(want).max() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("moe", ["reference", "cpu"])
@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_tokens_equal_the_dequantized_float_model(family, moe, awq_moe, monkeypatch):
    selected = engine_module.select_kernels
    monkeypatch.setattr(engine_module, "select_kernels",
                        lambda *a, **k: dataclasses.replace(selected(*a, **k), moe=moe))
    awq_dir, dense_dir = awq_moe(family)
    common = dict(skip_tokenizer=True, max_model_len=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    awq_llm = LLM(str(awq_dir), quantization="awq", **common)
    assert awq_llm.engine.runner.kernels.moe == moe
    got = awq_llm.generate(prompts, params, use_tqdm=False)
    want = LLM(str(dense_dir), **common).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len({tuple(o.outputs[0].token_ids) for o in got}) == len(PROMPTS)  # not one degenerate sequence


# (devices, expert parallel): Qwen2-MoE's shared expert (48 rows, 6 groups of 8) splits over 2 devices, not 4
PARALLEL = {"qwen2_moe": [(2, False), (2, True)], "mixtral": [(2, False), (2, True), (4, False), (4, True)]}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PARALLEL))
def test_tensor_and_expert_parallel_equal_one_device(family, awq_moe):
    """Group size 8: the experts' 32 intermediate rows split in whole groups over 2 and 4 devices."""
    loaded = load_model(awq_moe(family, 8)[0])
    want = logits_at(loaded, 1)
    for n, expert_parallel in PARALLEL[family]:
        parallel = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config,
                                                                          expert_parallel=expert_parallel))
        for got, expected in zip(logits_at(parallel, n), want, strict=True):
            np.testing.assert_allclose(got, expected, atol=LOGITS_TOLERANCE, rtol=0,
                                       err_msg=f"N = {n}, expert_parallel {expert_parallel}")


def test_groups_straddling_two_devices_are_refused_naming_the_expert_stack(awq_moe):
    """Group size 32: each expert's down_proj has one group of its 32 input rows, which two devices cannot split
    (expert parallelism keeps experts whole and can)."""
    awq_dir = awq_moe("mixtral", 32)[0]
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 cannot split .*w_experts_down.*groups of rows"):
        LLM(str(awq_dir), skip_tokenizer=True, max_model_len=32, tensor_parallel_size=2)
    LLM(str(awq_dir), skip_tokenizer=True, max_model_len=32, tensor_parallel_size=2, enable_expert_parallel=True)


def test_a_group_size_that_does_not_divide_the_expert_width_is_refused(awq_moe, tmp_path):
    awq_dir = awq_moe("qwen3_moe")[0]
    hf = json.loads((awq_dir / "config.json").read_text())
    hf["quantization_config"]["group_size"] = 64  # divides hidden_size 64, not moe_intermediate_size 32
    target = tmp_path / "g64"
    target.mkdir()
    for f in awq_dir.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    (target / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ModelLoadError, match=r"group_size 64 does not divide moe_intermediate_size 32"):
        load_model(target)


def test_lora_on_an_awq_moe_model_is_refused(awq_moe):
    with pytest.raises(ValueError, match=r"enable_lora is not supported for mixture-of-experts models \(mixtral\).*"
                                         "LoRA on expert weights is not implemented"):
        LLM(str(awq_moe("mixtral")[0]), skip_tokenizer=True, enable_lora=True)


def test_pallas_moe_kernels_give_the_reference_logits(awq_moe):
    """The int4 grouped matmuls (interpret mode) inside the whole forward."""
    loaded = load_model(awq_moe("qwen3_moe")[0])
    got = jit_forward(loaded.config, Kernels(moe="pallas", interpret=True))(
        loaded.params, init_kv_cache(loaded.config, 6, 4), batch())[0]
    np.testing.assert_allclose(np.asarray(got), _logits(loaded.config, loaded.params, "reference"), rtol=0, atol=1e-4)


def test_a_quantized_router_is_refused(awq_moe, tmp_path):
    """AutoAWQ keeps the router dense; a checkpoint that packs it names the tensor as unexpected."""
    from safetensors.numpy import load_file, save_file

    awq_dir = awq_moe("qwen3_moe")[0]
    target = tmp_path / "packed-router"
    target.mkdir()
    for f in awq_dir.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(target / "model.safetensors"))
    router = tensors.pop("model.layers.0.mlp.gate.weight")
    tensors["model.layers.0.mlp.gate.qweight"] = np.zeros((router.shape[1], router.shape[0] // 8), np.int32)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'model.layers.0.mlp.gate.qweight'"):
        load_model(target)


def test_expert_weights_of_another_format_are_refused_by_name():
    """Only dense and AWQ int4 stacks reach the experts (a LoRA delta on them is refused before: enable_lora)."""
    from jaxllm.model.weights import WeightFormat

    class Delta(WeightFormat):
        pass

    with pytest.raises(TypeError, match="expert weights in the Delta format are not supported"):
        expert_stack(Delta())


def test_experts_stored_in_different_formats_are_refused_by_name():
    """One expert int4, another dense: the stack cannot be built (assemble reports it as a ModelLoadError)."""
    from jaxllm.model.params import expert_field, fuse_layer_tensors

    def int4():  # stands for a dense [16, 16]
        return AWQWeight(qweight=np.zeros((2, 16), np.int32), zeros=np.zeros((1, 16), np.int8),
                         scales=np.ones((1, 16), np.float16))

    tensors = {expert_field(e, p): int4() if e == 0 else np.zeros((16, 16), np.float32)
               for e in range(2) for p in ("gate", "up", "down")}
    with pytest.raises(TypeError, match="cannot stack weights of different formats: AWQWeight, dense"):
        fuse_layer_tensors(tensors)
