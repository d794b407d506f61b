"""The `jaxllm` command line: `jaxllm generate PROMPT...` runs prompts through the engine and prints the text;
`jaxllm serve [MODEL]` runs the OpenAI-compatible HTTP server; `jaxllm quantize [MODEL] OUTPUT_DIR` writes an
AWQ int4 checkpoint; `jaxllm bench throughput` and `jaxllm bench serve` are vLLM's benchmarks (offline engine
throughput; latency and throughput of a running server)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time


GENERATE_DESCRIPTION = """Generate continuations of prompts. Every engine argument is a flag, as for
`jaxllm serve`; two defaults differ here: --max-model-len is 2048, and --max-num-seqs is the number of prompts
unless given. The sampling flags not given take the model's generation config (--generation-config,
--override-generation-config), else generate's own defaults: 32 tokens, greedy."""
SERVE_HELP = "serve the OpenAI-compatible HTTP API"
BENCH_HELP = "benchmark offline throughput or a running server, as `vllm bench`"
# generate's sampling defaults, for the flags not given that the generation config does not set either
GENERATE_SAMPLING_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": 0}


def main(argv: list[str] | None = None) -> int:
    from jaxllm.optional_deps import MissingDependencyError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    try:
        if args.command == "serve":
            if args.server_unavailable is not None:
                raise args.server_unavailable
            from jaxllm.entrypoints.openai.api_server import run_server

            return run_server(args)
        if args.command == "quantize":
            return _quantize(args)
        if args.command == "bench":
            return _bench(args)
        return _generate(args)
    except (ValueError, FileNotFoundError, MissingDependencyError) as e:  # bad input or a missing package: one
        print(f"jaxllm: error: {e}", file=sys.stderr)                      # clear line, no traceback
        return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`jaxllm generate`, `serve`, `quantize` and `bench`; generate, serve and bench throughput take every EngineArgs
    field as a flag (add_engine_args). `command`: the one about to run, when known; the flags of `serve` and
    `bench` are built only for it or for none (they import the server and the benchmarks: half a second that a
    one-prompt `generate` need not wait)."""
    from jaxllm.engine.arg_utils import add_engine_args

    parser = argparse.ArgumentParser(prog="jaxllm", description="LLM inference in JAX")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate continuations of prompts", description=GENERATE_DESCRIPTION)
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    unset = "default: the generation config's, else"  # None: not given (_sampling_params)
    gen.add_argument("--max-tokens", type=int, help=f"new tokens per prompt ({unset} 32)")
    gen.add_argument("--temperature", type=float, help=f"0 decodes greedily ({unset} 0)")
    gen.add_argument("--top-p", type=float, help=f"({unset} 1)")
    gen.add_argument("--top-k", type=int, help=f"0 keeps every token ({unset} 0)")
    gen.add_argument("--chat", action="store_true", help="send each prompt as a user message through the "
                     "model's chat template")
    add_engine_args(gen)
    # generate's own defaults: a context that compiles quickly, and one batch slot per prompt (None: set in
    # _generate from the number of prompts)
    gen.set_defaults(max_model_len=2048, max_num_seqs=None)
    if command in (None, "serve"):
        _add_serve_command(commands)
    else:
        commands.add_parser("serve", help=SERVE_HELP)
    from jaxllm.quantization.command import QUANTIZE_DESCRIPTION, add_quantize_args

    add_quantize_args(commands.add_parser("quantize", help="write an AWQ int4 checkpoint of a model",
                                          description=QUANTIZE_DESCRIPTION))
    if command in (None, "bench"):
        _add_bench_command(commands)
    else:
        commands.add_parser("bench", help=BENCH_HELP)
    return parser


def _add_bench_command(commands) -> None:
    """`jaxllm bench throughput` (the engine in this process) and `jaxllm bench serve` (a running server), with
    vLLM's flags; the implementations are jaxllm.benchmarks.throughput and jaxllm.benchmarks.serving."""
    from jaxllm.benchmarks import serving, throughput

    bench = commands.add_parser("bench", help=BENCH_HELP,
                                description="Benchmarks with vLLM's flags and summaries.")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    raw = argparse.RawDescriptionHelpFormatter  # the module docstrings, with their examples, as they are laid out
    throughput.add_cli_args(kinds.add_parser("throughput", help="offline engine throughput, as `vllm bench "
                                             "throughput`", description=throughput.__doc__, formatter_class=raw))
    serving.add_cli_args(kinds.add_parser("serve", help="latency and throughput of a running server, as `vllm bench "
                                          "serve`", description=serving.__doc__, epilog=serving.EPILOG,
                                          formatter_class=raw))


def _bench(args) -> int:
    from jaxllm.benchmarks import serving, throughput

    return (throughput if args.bench_command == "throughput" else serving).run_cli(args)


def _add_serve_command(commands) -> None:
    """`jaxllm serve` with the server's flags; without the server's packages (fastapi, uvicorn), a command that
    takes any arguments and says which package to install, so that `generate` and `quantize` still work."""
    from jaxllm.optional_deps import MissingDependencyError

    try:
        from jaxllm.entrypoints.openai.api_server import add_serve_args
    except MissingDependencyError as e:
        serve = commands.add_parser("serve", help=f"serve the OpenAI-compatible HTTP API (needs `{e.name}`)",
                                    prefix_chars="\0")  # no flags: every argument, --help too, lands in `ignored`
        serve.add_argument("ignored", nargs="*")
        serve.set_defaults(server_unavailable=e)
        return
    serve = add_serve_args(commands.add_parser("serve", help=SERVE_HELP))
    serve.set_defaults(server_unavailable=None)


def _generate(args) -> int:
    from jaxllm.engine.args import EngineArgs
    from jaxllm.llm import LLM

    _sampling_params(args, {})  # a bad flag fails before the model loads
    start = time.perf_counter()
    max_num_seqs = len(args.prompts) if args.max_num_seqs is None else args.max_num_seqs
    engine_args = EngineArgs.from_cli_args(args, max_num_seqs=max_num_seqs)
    llm = LLM(**dataclasses.asdict(engine_args))
    params = _sampling_params(args, llm.engine.sampling_defaults)
    if args.chat:
        from jinja2 import TemplateError

        try:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
        except TemplateError as e:  # the model's template: a one-line error
            raise ValueError(f"the chat template failed: {type(e).__name__}: {e}") from None
    else:
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    if llm.engine.process_index > 0:  # several processes ran the model: process 0 prints
        return 0
    for prompt, output in zip(args.prompts, outputs):
        text = output.outputs[0].text
        print(text if len(args.prompts) == 1 and not args.chat else f"{prompt!r} -> {text!r}", flush=True)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"[{tokens} tokens from {len(outputs)} prompts in {time.perf_counter() - start:.1f}s including load "
          f"and compile]", file=sys.stderr)
    return 0


def _sampling_params(args, generation_defaults: dict):
    """The flags given, then the generation config's values, then generate's own defaults."""
    from jaxllm.sampling_params import SamplingParams

    given = {name: getattr(args, name) for name in GENERATE_SAMPLING_DEFAULTS if getattr(args, name) is not None}
    return SamplingParams(**{**GENERATE_SAMPLING_DEFAULTS, **generation_defaults, **given})


def _quantize(args) -> int:
    """`jaxllm quantize`: progress on stderr, then one line saying what was written."""
    from jaxllm.quantization.command import model_argument
    from jaxllm.quantization.quantize import quantize_model

    summary = quantize_model(model_argument(args.model), args.output_dir, method=args.method,
                             group_size=args.group_size, calibration_file=args.calibration, clip=args.clip,
                             n_grid=args.grid, max_calibration_tokens=args.max_calibration_tokens)
    calibrated = f", calibrated on {summary.calibration_tokens} tokens" if summary.method == "awq" else ""
    print(f"wrote {summary.method.upper()} int4 (group size {summary.group_size}) checkpoint of "
          f"{summary.num_layers} layers to {summary.output_dir}{calibrated} in {summary.seconds:.1f}s", flush=True)
    return 0


def run() -> None:
    """The `jaxllm` command: main(), its output flushed, then out without the interpreter's teardown of JAX's
    runtime (half a second after a one-prompt `generate`, doing nothing a finished command needs; a chat template
    child process ends on its own when its pipe closes). A process of a group (several processes serving one
    model) exits normally: JAX's exit-time shutdown is the group's handshake, which the others wait for."""
    code = main()
    if _in_a_process_group():
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0 if code is None else code)


def _in_a_process_group() -> bool:
    jax = sys.modules.get("jax")  # not imported: no group was joined
    return jax is not None and jax.distributed.is_initialized()


if __name__ == "__main__":
    run()
