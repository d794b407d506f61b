"""EngineArgs: every field is a flag of `jaxllm generate` and `jaxllm serve`, fields are checked on construction,
and the GPU memory budget is a share of the device's memory within XLA's allocator limit."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxllm.config import SchedulerConfig
from jaxllm.engine.args import ACTIVATION_RESERVE_FRACTION, ATTENTION_CHOICES, DTYPE_CHOICES, SCHEDULING_POLICIES, \
    EngineArgs, xla_memory_fraction
from jaxllm.entrypoints.cli import build_parser, main
from jaxllm.entrypoints.openai.api_server import engine_args
from jaxllm.loaders.assemble import DTYPES
from jaxllm.model.kernels import resolve_attention
from jaxllm.sampling_batch import logit_state_bytes

# A value other than the default for every field: the flags built from it must give it back.
NON_DEFAULT = EngineArgs(model="some/model.gguf", dtype="bfloat16", quantization="awq", max_model_len=128,
                         max_num_seqs=3, max_num_batched_tokens=96, block_size=8, num_gpu_blocks=40,
                         gpu_memory_utilization=0.5, kv_cache_memory_bytes=1 << 20, enable_prefix_caching=False,
                         enable_chunked_prefill=False, scheduling_policy="priority", seed=7,
                         generation_config="vllm", override_generation_config={"temperature": 0.5, "top_k": None},
                         structured_outputs_config={"disable_any_whitespace": True},
                         speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                         attention="reference", awq_matmul="pallas", lora_matmul="reference", warmup=True,
                         disable_log_stats=True, async_scheduling=False, compilation_cache=False,
                         compilation_cache_dir="xla-cache", skip_tokenizer=True,
                         tensor_parallel_size=2, enable_expert_parallel=True, enable_lora=True, max_loras=3,
                         max_lora_rank=32, max_cpu_loras=5,
                         num_processes=2, process_id=1, coordinator_address="10.0.0.1:1234")


def _flags(args: EngineArgs) -> list[str]:
    """Command-line flags that set every field of `args`."""
    flags = []
    for field in dataclasses.fields(args):
        name, value = field.name.replace("_", "-"), getattr(args, field.name)
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        flags += [f"--{name}" if value else f"--no-{name}"] if isinstance(value, bool) else [f"--{name}", text]
    return flags


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_the_non_default_args_differ_from_the_defaults_in_every_field():
    same = [f.name for f in dataclasses.fields(EngineArgs) if getattr(NON_DEFAULT, f.name) == f.default]
    assert not same, f"give NON_DEFAULT a value other than the default for {same}"


@pytest.mark.parametrize("command", [["generate", "a prompt"], ["serve"]])
def test_every_field_is_a_flag_parsed_to_the_field_type(command):
    namespace = _parse(*command, *_flags(NON_DEFAULT))
    for field in dataclasses.fields(EngineArgs):
        parsed, expected = getattr(namespace, field.name), getattr(NON_DEFAULT, field.name)
        assert parsed == expected and type(parsed) is type(expected), field.name


def test_serve_flags_round_trip_to_engine_args():
    assert engine_args(_parse("serve", *_flags(NON_DEFAULT))) == NON_DEFAULT


def test_generate_flags_round_trip_to_engine_args():
    assert EngineArgs.from_cli_args(_parse("generate", "a prompt", *_flags(NON_DEFAULT))) == NON_DEFAULT


def test_serve_takes_the_model_as_positional_or_flag():
    assert engine_args(_parse("serve", "m.gguf")).model == "m.gguf"
    assert engine_args(_parse("serve", "--model", "m.gguf")).model == "m.gguf"


def test_serve_defaults_are_the_dataclass_defaults_with_warmup_on():
    assert engine_args(_parse("serve")) == EngineArgs(warmup=True)


def test_generate_defaults_are_the_dataclass_defaults_with_its_own_context_and_batch():
    namespace = _parse("generate", "a prompt")
    assert namespace.max_model_len == 2048 and namespace.max_num_seqs is None  # None: the number of prompts
    assert EngineArgs.from_cli_args(namespace, max_num_seqs=64) == EngineArgs(max_model_len=2048)


def test_flag_names_used_before_still_parse():
    namespace = _parse("serve", "m", "--no-enable-prefix-caching", "--no-warmup", "--max-num-seqs", "4",
                       "--max-model-len", "64", "--max-num-batched-tokens", "32", "--compilation-cache-dir", "d",
                       "--async-scheduling", "--dtype", "float32", "--seed", "3")
    assert engine_args(namespace) == EngineArgs(model="m", enable_prefix_caching=False, warmup=False, max_num_seqs=4,
                                                max_model_len=64, max_num_batched_tokens=32,
                                                compilation_cache_dir="d", dtype="float32", seed=3)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_help_lists_the_engine_flags(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--gpu-memory-utilization", "--scheduling-policy {fcfs,priority}", "--enable-chunked-prefill",
                 "--no-enable-prefix-caching", "--kv-cache-memory-bytes", "--attention {auto,cpu,pallas,reference}"):
        assert flag in out


def test_every_field_has_help():
    assert all(field.metadata.get("help") for field in dataclasses.fields(EngineArgs))


def test_choices_are_the_values_the_engine_accepts():
    assert DTYPE_CHOICES == ("auto", *DTYPES)
    assert {resolve_attention(name) for name in ATTENTION_CHOICES} <= set(ATTENTION_CHOICES)
    for policy in SCHEDULING_POLICIES:
        assert SchedulerConfig(policy=policy).policy == policy


@pytest.mark.parametrize("field, value, message", [
    ("max_num_seqs", 0, "max_num_seqs must be >= 1, got 0"),
    ("max_num_batched_tokens", 0, "max_num_batched_tokens must be >= 1, got 0"),
    ("max_model_len", 0, "max_model_len must be >= 1, got 0"),
    ("block_size", 0, "block_size must be >= 1, got 0"),
    ("block_size", 12, "block_size must be a power of two, got 12"),
    ("num_gpu_blocks", 1, "num_gpu_blocks must be >= 2, got 1"),
    ("kv_cache_memory_bytes", 0, "kv_cache_memory_bytes must be >= 1, got 0"),
    ("gpu_memory_utilization", 0.0, r"gpu_memory_utilization must be in \(0, 1\], got 0.0"),
    ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    ("dtype", "int8", "dtype must be one of auto, float32, bfloat16, float16; got 'int8'"),
    ("attention", "flash", "attention must be one of auto, cpu, pallas, reference; got 'flash'"),
    ("scheduling_policy", "lifo", "scheduling_policy must be one of fcfs, priority; got 'lifo'"),
    ("max_num_seqs", None, "max_num_seqs must be int, got None"),
    ("warmup", 1, "warmup must be bool, got 1"),
    ("seed", True, "seed must be int, got True"),
    ("model", 5, "model must be str or None, got 5"),
    ("gpu_memory_utilization", "high", "gpu_memory_utilization must be float, got 'high'"),
    ("override_generation_config", {"temp": 1}, r"override_generation_config: unknown key 'temp' \(known: .*\)"),
    ("override_generation_config", {"top_k": "5"}, "override_generation_config: top_k must be an integer .*"),
    ("override_generation_config", '{"top_k": 5}', "override_generation_config must be dict or None, got .*"),
    ("generation_config", "", "generation_config must be auto, vllm or a folder holding generation_config.json"),
])
def test_out_of_range_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        EngineArgs(**{field: value})


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seqs", "0"], "max_num_seqs must be >= 1, got 0"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be in (0, 1], got 1.5"),
    (["--block-size", "12"], "block_size must be a power of two, got 12"),
])
def test_out_of_range_flag_is_one_clean_line(flags, message, capsys):
    assert main(["generate", "hi", *flags]) == 2
    assert capsys.readouterr().err == f"jaxllm: error: {message}\n"


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"]])
@pytest.mark.parametrize("value, message", [
    ('{"temperature": 0.5', "not JSON (Expecting ',' delimiter"),
    ('{"temprature": 0.5}', "unknown key 'temprature' (known: repetition_penalty, temperature,"),
    ('{"temperature": "hot"}', "temperature must be a number >= 0 (finite), got 'hot'"),
])
def test_a_bad_override_is_refused_by_the_parser_naming_the_flag(command, value, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*command, "--override-generation-config", value])
    assert exited.value.code == 2
    assert f"argument --override-generation-config: {message}" in capsys.readouterr().err


def test_unknown_choice_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--scheduling-policy", "lifo"])
    assert exited.value.code == 2
    assert "invalid choice: 'lifo'" in capsys.readouterr().err


# ---------------------------------------------------------------- the GPU memory budget
GiB = 1 << 30
CAPACITY = 140 * GiB  # the device's memory
WEIGHTS = np.zeros(GiB // 4, np.float32)  # 1 GiB of parameters
PER_BLOCK = 1 << 20


class FakeGpu:
    """A device whose allocator limit is what XLA gives its allocator: the device's memory times the fraction."""

    def __init__(self, bytes_limit: int | None):
        self.stats = {} if bytes_limit is None else {"bytes_limit": bytes_limit, "bytes_in_use": 0}

    def memory_stats(self):
        return self.stats


@pytest.fixture
def gpu(monkeypatch):
    """Sets the XLA environment and the fake device's allocator limit, as XLA would compute it."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)

    def install(bytes_limit: int | None, **environment: str):
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(jax, "local_devices", lambda *_, **__: [FakeGpu(bytes_limit)])

    return install


VOCAB = 1000


def _kv_budget(utilization: float) -> int:
    loaded = SimpleNamespace(params={"w": WEIGHTS}, config=SimpleNamespace(vocab_size=VOCAB))
    return EngineArgs(gpu_memory_utilization=utilization)._gpu_budget(loaded, PER_BLOCK)


def _expected(usable: float) -> int:
    """What is left for the KV cache: less the weights and the sampling state (max_num_seqs slots of the vocab)."""
    return int(usable * (1 - ACTIVATION_RESERVE_FRACTION) - WEIGHTS.nbytes
               - logit_state_bytes(EngineArgs().max_num_seqs, VOCAB))


def test_default_environment_budget_is_a_share_of_the_device_within_the_allocator_limit(gpu):
    gpu(int(0.75 * CAPACITY))  # XLA's default: the allocator may use 75% of the device
    assert _kv_budget(0.5) == _expected(0.5 * CAPACITY)  # half the device, not half of the 75%
    assert _kv_budget(0.9) == _expected(0.75 * CAPACITY)  # more than the allocator allows: its limit


def test_mem_fraction_environment_variable_sets_the_allocator_limit(gpu):
    gpu(int(0.5 * CAPACITY), XLA_PYTHON_CLIENT_MEM_FRACTION="0.5")
    assert _kv_budget(0.4) == _expected(0.4 * CAPACITY)
    assert _kv_budget(0.9) == _expected(0.5 * CAPACITY)


def test_new_mem_fraction_name_is_read_first(gpu):
    gpu(int(0.95 * CAPACITY), XLA_CLIENT_MEM_FRACTION="0.95")
    assert _kv_budget(0.9) == _expected(0.9 * CAPACITY)


def test_without_preallocation_the_allocator_limit_is_the_same_fraction(gpu):
    gpu(int(0.75 * CAPACITY), XLA_PYTHON_CLIENT_PREALLOCATE="false")
    assert _kv_budget(0.5) == _expected(0.5 * CAPACITY)
    assert _kv_budget(0.9) == _expected(0.75 * CAPACITY)


def test_too_small_a_budget_names_gpu_memory_utilization(gpu):
    gpu(int(0.75 * CAPACITY))
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization=0\.005 leaves too little for the KV cache.*"
                                         r"raise gpu_memory_utilization"):
        _kv_budget(0.005)  # 0.7 GiB: less than the 1 GiB of weights


def test_unreadable_memory_size_is_a_clear_error(gpu):
    gpu(None)
    with pytest.raises(ValueError, match="cannot read the GPU's memory size"):
        _kv_budget(0.9)


@pytest.mark.parametrize("spec, fraction", [("", 0.75), ("0.5", 0.5), (".3", 0.3), ("0.75+", 0.75),
                                            ("0.6-0.9", 0.6), ("1e-1", 0.1), ("junk", 0.75), ("0", 0.75)])
def test_xla_memory_fraction_reads_the_preallocated_start(spec, fraction):
    assert xla_memory_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": spec}) == fraction


# ---------------------------------------------------------------- max_model_len against the KV pool
def _resolve(max_position_embeddings: int, **args):
    loaded = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=max_position_embeddings,
                                                    sliding_window=None))
    return EngineArgs(num_gpu_blocks=40, block_size=16, **args).resolve(loaded)[0].max_model_len


def test_unset_max_model_len_is_at_most_what_the_kv_cache_holds():
    assert _resolve(2**31 - 1) == 39 * 16  # block 0 is the null block
    assert _resolve(100) == 100
    assert _resolve(2**31 - 1, max_model_len=5000) == 5000  # set: as asked (requests the pool cannot hold are refused)


def test_processes_agree_on_the_pool_before_the_default_max_model_len():
    loaded = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2**31 - 1, sliding_window=None))
    scheduler, cache = EngineArgs(num_gpu_blocks=40, block_size=16).resolve(loaded, lambda n: n // 2)
    assert (cache.num_blocks, scheduler.max_model_len) == (20, 19 * 16)


@pytest.mark.parametrize("alias, dtype", [("half", "float16"), ("float", "float32")])
def test_vllm_dtype_names_are_taken(alias, dtype):
    assert EngineArgs(dtype=alias).dtype == dtype
    from jaxllm.entrypoints.cli import build_parser

    args = build_parser().parse_args(["serve", "--dtype", alias])
    assert EngineArgs.from_cli_args(args, model=None).dtype == dtype
