"""The OpenAI-compatible HTTP server: `jaxllm serve` or `python -m jaxllm.entrypoints.openai.api_server`.

One engine thread (AsyncEngine) steps the engine while uvicorn's event loop serves any number of connections;
SIGTERM stops accepting connections, lets the requests in flight finish (up to --shutdown-timeout), then drains
and stops the engine thread. With --enable-lora, --lora-modules name the LoRA adapters a request's `model` may pick
(serving_models.py); --allow-runtime-lora-updating adds /v1/load_lora_adapter and /v1/unload_lora_adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
from contextlib import asynccontextmanager
from typing import Sequence

from jaxllm.optional_deps import SERVER, require

try:  # the server's own packages; the engine, `LLM` and `jaxllm generate` need neither
    from fastapi import FastAPI, Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError:
    require("fastapi", SERVER)  # a missing package: MissingDependencyError naming it and the pip command
    require("starlette", SERVER, "fastapi")
    raise  # both there: something else failed, shown as it is

import jaxllm
from jaxllm.chat_renderer import DEFAULT_TIMEOUT_S
from jaxllm.entrypoints.openai.chat_options import ChatOptions, add_chat_args, chat_options
from jaxllm.entrypoints.openai.async_engine import DEFAULT_STALL_TIMEOUT_S, AsyncEngine
from jaxllm.entrypoints.openai.errors import OpenAIError, UnexpectedErrorsAsOpenAIErrors, error_response
from jaxllm.entrypoints.openai.guards import RequestGuard, RootPath
from jaxllm.entrypoints.openai.request_id import RequestIdHeader
from jaxllm.entrypoints.openai.metrics import ServerMetrics, load_report_header
from jaxllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, \
    LoadLoRAAdapterRequest, ModelList, TokenizeRequest, UnloadLoRAAdapterRequest
from jaxllm.entrypoints.openai.serving_base import RequestLimits, ResponseOptions
from jaxllm.entrypoints.openai.server_load import CountGenerationRequests, ServerLoad
from jaxllm.entrypoints.openai.serving_chat import ChatServing
from jaxllm.entrypoints.openai.serving_completion import CompletionServing
from jaxllm.entrypoints.openai.serving_models import RUNTIME_UPDATING_ENV, LoRAModule, ServedModels, \
    check_lora_modules, parse_lora_module, runtime_updating_allowed
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer, tokenizer_info

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20
API_KEY_ENV = ("JAXLLM_API_KEY", "VLLM_API_KEY")  # --api-key's defaults, in order (vLLM deployments set the second)
RESPONSE_SWITCHES = {  # vLLM's flags of what responses and routes carry, off by default
    "--return-tokens-as-token-ids": "logprob tokens as 'token_id:<id>' unless a request's return_tokens_as_token_ids "
                                    "says otherwise",
    "--enable-prompt-tokens-details": "usage carries prompt_tokens_details.cached_tokens (prompt tokens the prefix "
                                      "cache served)",
    "--enable-force-include-usage": "every stream carries the usage so far on each chunk and a last usage chunk, "
                                    "whatever its stream_options",
    "--enable-per-request-metrics": "responses (a stream: its usage chunk) of one prompt sampled once carry "
                                    "`metrics`: time to first token, queue and generation time, mean inter-token "
                                    "latency, tokens/s",
    "--enable-server-load-tracking": 'add GET /load: {"server_load": completion and chat requests in flight}',
    "--enable-tokenizer-info-endpoint": "add GET /tokenizer_info: the tokenizer's configuration, chat template "
                                        "included",
}
CLIENT_CLOSED_REQUEST = 499


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's own flags, then one flag per EngineArgs field (add_engine_args); warm-up is on by default."""
    from jaxllm.engine.arg_utils import add_engine_args

    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="GGUF file, HF directory or id in the local HF cache, or jaxllm checkpoint "
                             "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="model names the API accepts (default: the model argument)")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on every route but /health, /ping, /metrics and "
                             f"/version (default: ${API_KEY_ENV[0]}, else ${API_KEY_ENV[1]})")
    parser.add_argument("--root-path", default="",
                        help="the path prefix a proxy serves this server under (routes answer with and without it)")
    parser.add_argument("--max-queue-len", type=int, default=None,
                        help="sequences that may wait for a batch slot (a request counts its n or best_of); "
                             "more are refused with 429")
    parser.add_argument("--max-n", type=int, default=RequestLimits.max_n,
                        help="the largest n or best_of one request may ask for; larger ones are refused with 400")
    parser.add_argument("--max-request-sequences", type=int, default=RequestLimits.max_request_sequences,
                        help="the most sequences (prompts x best_of) one completion request may ask for")
    parser.add_argument("--max-stop-strings", type=int, default=RequestLimits.max_stop_strings,
                        help="the most stop strings one request may send; more are refused with 400")
    parser.add_argument("--max-stop-bytes", type=int, default=RequestLimits.max_stop_bytes,
                        help="the most bytes of stop strings (all together) one request may send")
    parser.add_argument("--engine-stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S,
                        help="seconds one engine step may run before /health answers 503 (a wedged engine)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies are refused with 413")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish after SIGTERM")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--uvicorn-log-level", default=None, help="uvicorn's log level (default: --log-level)")
    parser.add_argument("--disable-uvicorn-access-log", action="store_true", default=False)
    parser.add_argument("--enable-log-requests", action="store_true", default=False,
                        help="log each request: its id, prompt lengths and sampling parameters")
    parser.add_argument("--disable-log-requests", dest="enable_log_requests", action="store_false",
                        help="do not log requests (the default; vLLM's older flag)")
    parser.add_argument("--allowed-origins", type=_json_list, default=[],
                        help='CORS: origins allowed to call the API, a JSON list (\'["*"]\' for any); none by default')
    parser.add_argument("--allowed-methods", type=_json_list, default=["*"], help="CORS: a JSON list of methods")
    parser.add_argument("--allowed-headers", type=_json_list, default=["*"], help="CORS: a JSON list of headers")
    parser.add_argument("--allow-credentials", action="store_true", default=False, help="CORS: allow credentials")
    parser.add_argument("--disable-fastapi-docs", action="store_true", default=False,
                        help="no /docs, /redoc or /openapi.json")
    parser.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=None, metavar="NAME=PATH",
                        help="LoRA adapters (PEFT directories) served under their own model names, as name=path "
                             "or '{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; needs --enable-lora; "
                             "each is read and checked at start-up")
    parser.add_argument("--allow-runtime-lora-updating", action="store_true", default=False,
                        help="add POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also "
                             f"{RUNTIME_UPDATING_ENV}=1); without it those routes do not exist")
    for flag, help_text in RESPONSE_SWITCHES.items():
        parser.add_argument(flag, action="store_true", default=False, help=help_text)
    parser.add_argument("--chat-template-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds the chat template may take on one request's messages; a request over it is "
                             "refused with 400 (the template runs in a child process under a memory bound too)")
    add_chat_args(parser)
    add_engine_args(parser)  # every EngineArgs field; --model is the same as MODEL
    parser.set_defaults(warmup=True)  # serve's own default: build every program before accepting requests
    return parser


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"a JSON list of strings is needed, got {text!r}")
    return value


def engine_args(args: argparse.Namespace):
    """EngineArgs from the parsed flags; the model is --model or MODEL."""
    from jaxllm.engine.args import EngineArgs

    return EngineArgs.from_cli_args(args, model=args.model or args.model_tag)


def served_names(args: argparse.Namespace) -> list[str]:
    return args.served_model_name or [args.model or args.model_tag or "SmolLM2-135M-Instruct"]


def check_lora_args(args: argparse.Namespace) -> None:
    """ValueError for --lora-modules that could never be served (before the model is loaded)."""
    check_lora_modules(args.lora_modules or [], served_names(args), args.enable_lora)


def build_app(engine, served_model_names: list[str], *, api_key: str | None = None,
              max_queue_len: int | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              limits: RequestLimits = RequestLimits(), stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
              lora_modules: Sequence[LoRAModule] = (), allow_runtime_lora_updating: bool = False,
              options: ResponseOptions = ResponseOptions(), server_load_tracking: bool = False,
              tokenizer_info_endpoint: bool = False, chat_template_timeout_s: float = DEFAULT_TIMEOUT_S,
              root_path: str = "", cors: dict | None = None, docs: bool = True,
              chat: ChatOptions = ChatOptions()) -> FastAPI:
    """The app over `engine`. lora_modules are registered now (engine.add_lora: ValueError naming the module and
    the problem); allow_runtime_lora_updating adds the load/unload routes, server_load_tracking GET /load and
    tokenizer_info_endpoint GET /tokenizer_info; cors: CORSMiddleware's arguments (None: no CORS); docs: FastAPI's
    /docs, /redoc and /openapi.json."""
    metrics = ServerMetrics(served_model_names[0], engine.scheduler_config.max_model_len)
    metrics.describe_cache(engine.cache_config)
    async_engine = AsyncEngine(engine, metrics, max_queue_len, stall_timeout_s)
    models = ServedModels(async_engine, served_model_names)
    models.add_at_start(lora_modules)  # before the engine thread starts: the engine is still this thread's
    # copied before the engine thread starts using its own
    tokenizers = ServerTokenizer(engine.tokenizer, template_timeout_s=chat_template_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tokenizers.start_renderers()
        async_engine.start()
        yield
        async_engine.shutdown()  # uvicorn already waited for the requests in flight
        tokenizers.shutdown()

    no_docs = {} if docs else dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="jaxllm", version=jaxllm.__version__, lifespan=lifespan, **no_docs)
    app.state.async_engine, app.state.metrics, app.state.models = async_engine, metrics, models
    app.state.completions = CompletionServing(async_engine, served_model_names, tokenizers, limits, models, options)
    app.state.chat = ChatServing(async_engine, served_model_names, tokenizers, limits, models, options, chat=chat)
    _add_error_handlers(app)
    app.add_middleware(UnexpectedErrorsAsOpenAIErrors)
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_body_bytes)
    app.add_middleware(RequestIdHeader)  # the last added runs first: every response carries the id
    if cors is not None:
        app.add_middleware(CORSMiddleware, **cors)  # preflight requests are answered before the key check
    if root_path:
        app.add_middleware(RootPath, root_path=root_path)  # outermost: every layer sees the path it strips
    _add_routes(app)
    if allow_runtime_lora_updating:
        logger.warning("runtime LoRA updating is on: any client may load adapters from this host's files")
        _add_lora_routes(app)
    if server_load_tracking:
        _add_load_route(app)
    if tokenizer_info_endpoint:
        _add_tokenizer_info_route(app)
    return app


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
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type", "value_error") != "value_error":  # pydantic's own check: its kind, as vLLM shows it
            message += f" [type={first['type']}]"
        if loc:
            return error_response(400, f"{'.'.join(loc)}: {message}", ".".join(loc))
        field = re.match(r"([A-Za-z_]\w*)[.\[:]", message)  # a check of the whole body names its field first
        return error_response(400, message if field else f"body: {message}", field and field.group(1))

    @app.exception_handler(ClientDisconnected)
    async def client_gone(_: Request, e: "ClientDisconnected"):
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: nginx's code, for the access log

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))


def _add_routes(app: FastAPI) -> None:
    state = app.state

    @app.get("/health")
    async def health():
        problem = state.async_engine.health_problem()
        return Response(status_code=200) if problem is None else error_response(503, problem, code="engine_unhealthy")

    app.add_api_route("/ping", health, methods=["GET", "POST"])  # vLLM's (SageMaker's) name for /health

    @app.get("/version")
    async def version():
        return {"version": jaxllm.__version__}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return ModelList(data=state.models.cards(state.completions.max_model_len))

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw_request: Request):
        _name_by_client_id(request, raw_request)
        return _respond(await _unless_disconnected(raw_request, state.completions.create(request)),
                        _load_report(raw_request, state.metrics))

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest, raw_request: Request):
        _name_by_client_id(request, raw_request)
        return _respond(await _unless_disconnected(raw_request, state.chat.create(request)),
                        _load_report(raw_request, state.metrics))

    @app.post("/invocations")
    async def invocations(body: dict, raw_request: Request):
        """vLLM's (SageMaker's) one route: a body with "messages" is a chat request, else a completion."""
        kind, route = (ChatCompletionRequest, chat) if "messages" in body else (CompletionRequest, completions)
        try:
            request = kind.model_validate(body)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        return await route(request, raw_request)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest):
        return await _tokenize(state.chat, request)

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest):
        return await _detokenize(state.chat, request)


def _add_lora_routes(app: FastAPI) -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes): 200 with a line of text."""
    models: ServedModels = app.state.models

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoRAAdapterRequest):
        return Response(await models.load(request.lora_name, request.lora_path), media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest):
        return Response(await models.unload(request.lora_name), media_type="text/plain")


def _add_load_route(app: FastAPI) -> None:
    """GET /load (vLLM's): {"server_load": completion and chat requests in flight}."""
    server_load = ServerLoad()
    app.add_middleware(CountGenerationRequests, load=server_load)

    @app.get("/load")
    async def load():
        return {"server_load": server_load.count}


def _add_tokenizer_info_route(app: FastAPI) -> None:
    serving: ChatServing = app.state.chat

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        if not serving.tokenizers.available:
            raise OpenAIError(404, "this server runs without a tokenizer")
        return await serving.tokenizers.run(tokenizer_info)


class ClientDisconnected(Exception):
    pass


async def _unless_disconnected(raw_request: Request, work):
    """Await `work` (a response being computed) unless the client goes away first: then cancel it, which aborts
    its engine requests and frees their blocks, as a closed stream does."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(raw_request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected
    return task.result()


async def _disconnected(raw_request: Request) -> None:
    """Returns once the client has disconnected (the body was already read, so only that message is left)."""
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass


def _name_by_client_id(request, raw_request: Request) -> None:
    """A client's X-Request-Id names the response, before the body's request_id (vLLM)."""
    client_id = getattr(raw_request.state, "client_request_id", None)
    if client_id is not None:
        request.request_id = client_id


def _respond(result, headers: dict[str, str]):
    if hasattr(result, "__aiter__"):
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
    return JSONResponse(result.model_dump(), headers=headers)


def _load_report(raw_request: Request, metrics: ServerMetrics) -> dict[str, str]:
    """The ORCA load report header when the client asks for one (endpoint-load-metrics-format)."""
    report_format = raw_request.headers.get("endpoint-load-metrics-format")
    return {} if report_format is None else load_report_header(report_format, metrics.engine_stats)


async def _tokenize(serving: ChatServing, request: TokenizeRequest) -> dict:
    serving.check_model(request.model)
    if not serving.tokenizers.available:
        raise OpenAIError(400, "this server runs without a tokenizer")
    if (request.prompt is None) == (request.messages is None):
        raise OpenAIError(400, "send exactly one of 'prompt' and 'messages'", "prompt")
    if request.messages is not None:
        tokens = await serving.render(request)
    else:
        tokens = await serving.tokenizers.run(
            lambda tokenizer: tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
    strs = await serving.tokenizers.run(lambda tokenizer: tokenizer.convert_ids_to_tokens(tokens)) \
        if request.return_token_strs else None
    return {"tokens": tokens, "count": len(tokens), "max_model_len": serving.max_model_len, "token_strs": strs}


async def _detokenize(serving: ChatServing, request: DetokenizeRequest) -> dict:
    serving.check_model(request.model)
    vocab = serving.engine.engine.model_config.vocab_size
    bad = [t for t in request.tokens if not 0 <= t < vocab]
    if bad:
        raise OpenAIError(400, f"tokens {bad[:8]} are not token ids in [0, {vocab})", "tokens")
    if not serving.tokenizers.available:
        raise OpenAIError(400, "this server runs without a tokenizer")
    return {"prompt": await serving.tokenizers.run(lambda tokenizer: tokenizer.decode(request.tokens))}


def run_server(args: argparse.Namespace) -> int:
    uvicorn = require("uvicorn", SERVER)

    import jax

    from jaxllm.engine.engine import LLMEngine
    from jaxllm.engine.multiprocess_engine import LeaderEngine, follow

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("jaxllm").setLevel(args.log_level.upper())  # also when a library configured logging first
    # SIGTERM is the normal way to stop the server: uvicorn handles it while serving (graceful shutdown) and
    # re-raises it afterwards, which this handler turns into a clean exit (status 0), as it does during loading.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    check_lora_args(args)
    chat = chat_options(args)  # flags that do not go together stop the start before the model loads
    engine = LLMEngine(engine_args(args))
    if jax.process_count() > 1:  # several processes run the model: process 0 serves, the others follow it
        if jax.process_index() > 0:
            follow(engine)
            return 0
        engine = LeaderEngine(engine)
    limits = RequestLimits(args.max_n, args.max_request_sequences, args.max_stop_strings, args.max_stop_bytes)
    api_key = args.api_key or next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)
    app = build_app(engine, served_names(args), api_key=api_key, max_queue_len=args.max_queue_len,
                    max_body_bytes=args.max_body_bytes, limits=limits,
                    stall_timeout_s=args.engine_stall_timeout, lora_modules=args.lora_modules or [],
                    allow_runtime_lora_updating=runtime_updating_allowed(args.allow_runtime_lora_updating),
                    options=ResponseOptions(
                        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                        enable_force_include_usage=args.enable_force_include_usage,
                        enable_per_request_metrics=args.enable_per_request_metrics,
                        enable_log_requests=args.enable_log_requests),
                    server_load_tracking=args.enable_server_load_tracking,
                    tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
                    chat_template_timeout_s=args.chat_template_timeout, root_path=args.root_path,
                    cors=_cors(args), docs=not args.disable_fastapi_docs, chat=chat)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level or args.log_level,
                            access_log=not args.disable_uvicorn_access_log,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    try:
        uvicorn.Server(config).run()  # a SIGTERM ends it with SystemExit (uvicorn re-raises the signal)
    finally:
        if isinstance(engine, LeaderEngine):
            engine.stop()
            if engine.lost is not None:
                _exit_without_the_group(engine.lost)
    return 0


def _cors(args: argparse.Namespace) -> dict | None:
    """CORSMiddleware's arguments from vLLM's flags; None without allowed origins."""
    if not args.allowed_origins:
        return None
    return dict(allow_origins=args.allowed_origins, allow_methods=args.allowed_methods,
                allow_headers=args.allowed_headers, allow_credentials=args.allow_credentials)


def _exit_without_the_group(lost: str) -> None:
    """A process of the group is gone: JAX's exit-time shutdown would wait for it (or abort in C++), so exit at
    once with one line naming what failed."""
    print(f"jaxllm: error: the processes serving together lost one (a collective with it failed: {lost}); "
          f"process 0 exits without the group's shutdown", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(1)


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
