"""The OpenAI-compatible HTTP server: `jaxllm serve` or `python -m jaxllm.entrypoints.openai.api_server`.

One engine thread (AsyncEngine) steps the engine while uvicorn's event loop serves any number of connections;
SIGTERM stops accepting connections, lets the requests in flight finish (up to --shutdown-timeout), then drains
and stops the engine thread.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import jaxllm
from jaxllm.entrypoints.openai.async_engine import AsyncEngine
from jaxllm.entrypoints.openai.errors import OpenAIError, error_response
from jaxllm.entrypoints.openai.guards import RequestGuard
from jaxllm.entrypoints.openai.metrics import ServerMetrics
from jaxllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, \
    ModelCard, ModelList, TokenizeRequest
from jaxllm.entrypoints.openai.serving_chat import ChatServing
from jaxllm.entrypoints.openai.serving_completion import CompletionServing

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="GGUF file, HF directory or id in the local HF cache, or jaxllm checkpoint "
                             "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--model", default=None, help="same as MODEL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="model names the API accepts (default: the model argument)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    parser.add_argument("--max-queue-len", type=int, default=None,
                        help="requests that may wait for a batch slot; more are refused with 429")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies are refused with 413")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish after SIGTERM")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-gpu-blocks", type=int, default=None)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="build every step program before serving, so that no request waits for a compile "
                             "(default: on; --no-warmup starts faster and compiles on first use)")
    parser.add_argument("--compilation-cache-dir", default=None,
                        help="persistent XLA compilation cache: programs built once load in a fraction of the "
                             "time at the next start")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                        help="dispatch each engine step before the previous one's tokens are back (default: on)")
    parser.add_argument("--log-level", default="info")
    return parser


def engine_args(args: argparse.Namespace):
    from jaxllm.engine.args import EngineArgs

    return EngineArgs(model=args.model or args.model_tag, dtype=args.dtype, max_model_len=args.max_model_len,
                      max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks,
                      kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                      enable_prefix_caching=args.enable_prefix_caching, seed=args.seed, warmup=args.warmup,
                      compilation_cache_dir=args.compilation_cache_dir, async_scheduling=args.async_scheduling)


def served_names(args: argparse.Namespace) -> list[str]:
    return args.served_model_name or [args.model or args.model_tag or "SmolLM2-135M-Instruct"]


def build_app(engine, served_model_names: list[str], *, api_key: str | None = None,
              max_queue_len: int | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    metrics = ServerMetrics(served_model_names[0])
    async_engine = AsyncEngine(engine, metrics, max_queue_len)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        yield
        async_engine.shutdown()  # uvicorn already waited for the requests in flight

    app = FastAPI(title="jaxllm", version=jaxllm_version(), lifespan=lifespan)
    app.state.async_engine, app.state.metrics = async_engine, metrics
    app.state.completions = CompletionServing(async_engine, served_model_names)
    app.state.chat = ChatServing(async_engine, served_model_names)
    _add_error_handlers(app)
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_body_bytes)
    _add_routes(app)
    return app


def jaxllm_version() -> str:
    return getattr(jaxllm, "__version__", None) or _package_version()


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxllm")
    except PackageNotFoundError:
        return "unknown"


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, e: OpenAIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return error_response(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}")
        return error_response(400, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}",
                              ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))


def _add_routes(app: FastAPI) -> None:
    state = app.state

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.async_engine.is_alive else 503)

    @app.get("/version")
    async def version():
        return {"version": jaxllm_version()}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        serving = state.completions
        return ModelList(data=[ModelCard(id=name, root=name, max_model_len=serving.max_model_len)
                               for name in serving.model_names])

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        return _respond(await state.completions.create(request))

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest):
        return _respond(await state.chat.create(request))

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest):
        return _tokenize(state.chat, request)

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest):
        return _detokenize(state.chat, request)


def _respond(result):
    if hasattr(result, "__aiter__"):
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return JSONResponse(result.model_dump())


def _tokenize(serving: ChatServing, request: TokenizeRequest) -> dict:
    serving.check_model(request.model)
    if serving.tokenizer is None:
        raise OpenAIError(400, "this server runs without a tokenizer")
    if (request.prompt is None) == (request.messages is None):
        raise OpenAIError(400, "send exactly one of 'prompt' and 'messages'", "prompt")
    if request.messages is not None:
        tokens = serving.render(request.messages)
    else:
        tokens = serving.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": serving.max_model_len}


def _detokenize(serving: ChatServing, request: DetokenizeRequest) -> dict:
    serving.check_model(request.model)
    vocab = serving.engine.engine.model_config.vocab_size
    bad = [t for t in request.tokens if not 0 <= t < vocab]
    if bad:
        raise OpenAIError(400, f"tokens {bad[:8]} are not token ids in [0, {vocab})", "tokens")
    if serving.tokenizer is None:
        raise OpenAIError(400, "this server runs without a tokenizer")
    return {"prompt": serving.tokenizer.decode(request.tokens)}


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from jaxllm.engine.engine import LLMEngine

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGTERM is the normal way to stop the server: uvicorn handles it while serving (graceful shutdown) and
    # re-raises it afterwards, which this handler turns into a clean exit (status 0), as it does during loading.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    engine = LLMEngine(engine_args(args))
    app = build_app(engine, served_names(args), api_key=args.api_key, max_queue_len=args.max_queue_len,
                    max_body_bytes=args.max_body_bytes)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    uvicorn.Server(config).run()
    return 0


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = add_serve_args(argparse.ArgumentParser(prog="jaxllm-api-server", description=__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    try:
        return run_server(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"jaxllm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
