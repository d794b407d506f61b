"""jaxllm without the packages only some features need (gguf; fastapi, uvicorn, starlette), as on a GPU machine
that lacks them: everything else imports and runs, and the feature that needs one names it when used.

The GPU check script's run under the same blocking is tests/kernels/test_gpu_check_smoke.py.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.blocked_packages import run_blocked
from tests.fake_devices import child_environment

IMPORTS = textwrap.dedent("""
    import importlib
    for name in ("gguf", "fastapi", "uvicorn", "starlette"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"{name} was not blocked")
    import jaxllm, jaxllm.engine.engine, jaxllm.model, jaxllm.loaders, jaxllm.llm, jaxllm.tokenizer
    import jaxllm.loaders.safetensors, jaxllm.loaders.orbax, jaxllm.quantization.quantize, jaxllm.benchmarks.harness
    import pallas_kernels.paged_attention, pallas_kernels.awq_matmul, pallas_kernels.lora
    from jaxllm.entrypoints.cli import build_parser
    args = build_parser().parse_args(["generate", "hi", "--max-model-len", "64"])
    assert args.max_model_len == 64
    print("IMPORTED", sorted(n for n in ("gguf", "fastapi", "uvicorn", "starlette") if sys.modules.get(n)))
""")


def test_everything_but_gguf_and_the_server_imports_without_them():
    proc = run_blocked(IMPORTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "IMPORTED []" in proc.stdout


ORBAX_ROUND_TRIP = textwrap.dedent("""
    import jax, numpy as np
    from jaxllm import load_model
    from jaxllm.benchmarks.model_presets import model_preset
    from jaxllm.loaders import save_checkpoint
    from jaxllm.model import random_params
    config = model_preset("tiny")
    params = random_params(config, jax.random.key(0))
    save_checkpoint(CKPT, config, params)
    loaded = load_model(CKPT, dtype="float32")
    assert loaded.config == config
    np.testing.assert_array_equal(np.asarray(loaded.params.layers[1].w_down), np.asarray(params.layers[1].w_down))
    print("LOADED")
""")


@pytest.mark.slow
def test_orbax_checkpoint_loads_without_gguf(tmp_path):
    proc = run_blocked(f"CKPT = {str(tmp_path / 'ckpt')!r}\n" + ORBAX_ROUND_TRIP,
                       env=child_environment())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "LOADED" in proc.stdout


@pytest.fixture
def tiny_gguf(tmp_path):
    """A valid GGUF file (metadata, one Q6_K tensor: the k-quants are what needs the gguf package to decode),
    written with the gguf package this process has."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_embedding_length(256)  # one Q6_K block per row
    writer.add_feed_forward_length(256)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(8)
    writer.add_tensor("token_embd.weight", np.zeros((8, 210), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GGUF_MESSAGE = "decoding a GGUF k-quant tensor (Q4_K, Q6_K) needs the `gguf` package: pip install gguf"


def test_loading_a_gguf_without_gguf_names_the_package(tiny_gguf):
    code = textwrap.dedent(f"""
        from jaxllm import load_model
        from jaxllm.optional_deps import MissingDependencyError
        try:
            load_model({str(tiny_gguf)!r})
        except MissingDependencyError as e:
            assert e.name == "gguf", e.name
            print("RAISED", e)
        else:
            raise SystemExit("loaded a GGUF without gguf")
    """)
    proc = run_blocked(code)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"RAISED {GGUF_MESSAGE}" in proc.stdout


@pytest.mark.slow
def test_cli_names_the_missing_package(tiny_gguf):
    """`jaxllm generate` on a GGUF and `jaxllm serve` without their packages: one line naming it, status 2."""
    run_cli = "import sys\nfrom jaxllm.entrypoints.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    code = run_cli.replace("sys.argv[1:]", f"['generate', 'hi', '--model', {str(tiny_gguf)!r}]")
    proc = run_blocked(code)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"jaxllm: error: {GGUF_MESSAGE}" in proc.stderr and "Traceback" not in proc.stderr
    for argv in (["serve", "--port", "8123"], ["serve", "--help"]):
        proc = run_blocked(run_cli.replace("sys.argv[1:]", repr(argv)))
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "jaxllm: error: the OpenAI-compatible server (jaxllm serve) needs the `fastapi` package: " \
               "pip install fastapi" in proc.stderr, proc.stderr
    proc = run_blocked(run_cli.replace("sys.argv[1:]", "['serve', '--help']"), names=("uvicorn",))
    assert proc.returncode == 0 and "--max-queue-len" in proc.stdout, proc.stderr[-3000:]  # flags need no uvicorn
    proc = run_blocked(run_cli.replace("sys.argv[1:]", "['serve', '--port', '8123']"), names=("uvicorn",))
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # named before any model is loaded
    assert "needs the `uvicorn` package: pip install uvicorn" in proc.stderr, proc.stderr
