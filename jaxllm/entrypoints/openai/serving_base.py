"""What completions and chat share: the model check (a base model or a LoRA adapter), request limits, prompt
encoding, request submission, SSE framing, logprob formats."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import AsyncIterator, Sequence

from pydantic import BaseModel

from jaxllm.entrypoints.openai.async_engine import AsyncEngine, EngineDeadError, QueueFullError, \
    RequestFailedError, RequestStream
from jaxllm.entrypoints.openai.errors import OpenAIError, bad_request
from jaxllm.entrypoints.openai.protocol import PerRequestMetrics, PromptLogprob, SamplingRequest
from jaxllm.entrypoints.openai.request_fields import unsupported_field
from jaxllm.entrypoints.openai.serving_models import ServedModels
from jaxllm.entrypoints.openai.structured_fields import StructuredOutputFields
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer
from jaxllm.lora.manager import AdapterRemovedError
from jaxllm.lora.request import LoRARequest
from jaxllm.outputs import Logprob, RequestMetrics, RequestOutput
from jaxllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for, whatever the server's load (the server's flags of the same names)."""

    max_n: int = 64  # n and best_of
    max_request_sequences: int = 1024  # prompts x best_of of one completion request
    max_stop_strings: int = 256  # stop strings of one request
    max_stop_bytes: int = 16384  # their total UTF-8 length


@dataclasses.dataclass(frozen=True)
class ResponseOptions:
    """What responses carry by the server's flags (vLLM's flags of the same names)."""

    return_tokens_as_token_ids: bool = False  # logprob tokens as "token_id:<id>" unless a request says otherwise
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens
    enable_force_include_usage: bool = False  # every stream carries the usage on every chunk and at its end
    enable_per_request_metrics: bool = False  # responses of one prompt sampled once carry its timing
    enable_log_requests: bool = False  # log each request: its id, prompt lengths and sampling parameters


class ServingBase:
    request_kind = "completion"  # which of vLLM's request models the body follows (request_fields.py)

    def __init__(self, engine: AsyncEngine, served_model_names: Sequence[str], tokenizers: ServerTokenizer,
                 limits: RequestLimits = RequestLimits(), models: ServedModels | None = None,
                 options: ResponseOptions = ResponseOptions()):
        """models: the server's base models and LoRA adapters (None: the served names, no adapters)."""
        self.engine = engine
        self.options = options
        self.tokenizers = tokenizers
        self.models = models if models is not None else ServedModels(engine, served_model_names)
        self.model_names = self.models.base_names
        self.max_model_len = engine.engine.scheduler_config.max_model_len
        # what a request's unset sampling fields take: the generation config's (vLLM's default_sampling_params)
        self.sampling_defaults = engine.engine.sampling_defaults
        self.structured_outputs_config = engine.engine.structured_outputs_config
        self.limits = limits

    @property
    def tokenizer(self):
        """The event loop's own tokenizer (see tokenization.py): only for work done on the event loop."""
        return self.tokenizers.get()

    def tokens_as_ids(self, request: SamplingRequest) -> bool:
        """Whether the request's logprob tokens are written "token_id:<id>" (its field, else the server's flag)."""
        asked = request.return_tokens_as_token_ids
        return self.options.return_tokens_as_token_ids if asked is None else asked

    def stream_usage(self, request: SamplingRequest) -> tuple[bool, bool]:
        """(a last chunk with the usage, the usage so far on every chunk) for a stream."""
        if self.options.enable_force_include_usage:
            return True, True
        return request.include_usage, request.continuous_usage

    def request_metrics(self, outputs: list[RequestOutput | None], n: int,
                        num_generated: int) -> PerRequestMetrics | None:
        """The request's timing (--enable-per-request-metrics) from its last output, when it is one prompt
        sampled once (vLLM's rule: otherwise the times span several sequences)."""
        if not self.options.enable_per_request_metrics or len(outputs) != 1 or n != 1 or outputs[0] is None:
            return None
        return timing_metrics(outputs[0].metrics, num_generated)

    def cached_tokens(self, count: int) -> int | None:
        """usage's cached-token count, when the server reports it (--enable-prompt-tokens-details)."""
        return count if self.options.enable_prompt_tokens_details else None

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter the request's `model` names, None for a base model; a 404 for a name not served."""
        return self.models.resolve(model)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def response_model(self, lora_request: LoRARequest | None) -> str:
        """A response's `model`: the adapter's name, or the first served name."""
        return self.models.response_name(lora_request)

    def sampling_params(self, request: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                        max_tokens_field: str = "max_tokens") -> SamplingParams:
        """The request's SamplingParams, the fields it leaves unset from the generation config; a bad value is a
        400 naming its field (max_tokens as the request spelled it); a field jaxllm does not implement is a 400
        naming it."""
        field = unsupported_field(request.model_extra, self.request_kind)
        if field is not None:
            raise bad_request(f"{field} is not supported", field)
        if not request.use_beam_search and request.length_penalty != 1.0:
            raise bad_request("length_penalty needs use_beam_search (it only ranks beam search hypotheses)",
                              "length_penalty")
        for name in ("n", "best_of"):
            value = getattr(request, name, None)
            if isinstance(value, int) and value > self.limits.max_n:
                raise bad_request(f"{name} must be <= {self.limits.max_n} (this server's limit), got {value}", name)
        try:
            params = request.sampling_params(max_tokens, logprobs, self.sampling_defaults)
        except ValueError as e:
            message, field = str(e), _field_named_in(str(e))
            if field == "max_tokens" and max_tokens_field != field:
                message, field = message.replace("max_tokens", max_tokens_field, 1), max_tokens_field
            raise bad_request(message, field) from None
        self._check_stop_limits(params.stop)
        if params.structured_outputs is not None:  # the engine's defaults, before the parse
            params.structured_outputs = self.structured_outputs_config.apply(params.structured_outputs)
        return params

    def fit_default_max_tokens(self, params: SamplingParams, prompt_tokens: int) -> SamplingParams:
        """params with a default max_tokens (the generation config's max_new_tokens, for a request that set none)
        at most what the context leaves after the prompt, as vLLM caps it (a request's own is checked instead)."""
        room = self.max_model_len - prompt_tokens  # min_tokens beyond it: the engine refuses the request, naming both
        if params.max_tokens is None or params.max_tokens <= room:
            return params
        return dataclasses.replace(params, max_tokens=max(1, params.min_tokens, room))

    def _check_stop_limits(self, stop: list[str]) -> None:
        if len(stop) > self.limits.max_stop_strings:
            raise bad_request(f"stop: at most {self.limits.max_stop_strings} strings (this server's limit), got "
                              f"{len(stop)}", "stop")
        size = sum(len(s.encode()) for s in stop)
        if size > self.limits.max_stop_bytes:
            raise bad_request(f"stop: at most {self.limits.max_stop_bytes} bytes in all (this server's limit), got "
                              f"{size}", "stop")

    async def encode_prompt(self, text: str) -> dict:
        """A text prompt as the engine takes it, encoded on a tokenizer worker (never on the engine thread)."""
        if not self.tokenizers.available:
            raise bad_request("text prompts need a tokenizer; this server runs without one: send token ids",
                              "prompt")
        token_ids = await self.tokenizers.run(lambda tokenizer: tokenizer.encode(text))
        return {"prompt": text, "prompt_token_ids": token_ids}

    async def submit(self, request_id: str, prompts: list[dict], params: SamplingParams,
                     lora_request: LoRARequest | None = None, priority: int = 0) -> list[RequestStream]:
        """Submit every prompt (with `lora_request`'s adapter, if any, and the scheduler's `priority`); on any
        failure abort those already accepted and raise an OpenAIError."""
        sequences = len(prompts) * params.num_sequences
        if sequences > self.limits.max_request_sequences:
            raise bad_request(f"prompt: {len(prompts)} prompts x {params.num_sequences} samples is {sequences} "
                              f"sequences; this server takes at most {self.limits.max_request_sequences} per "
                              f"request", "prompt")
        try:
            self.engine.check_capacity(len(prompts) * params.num_sequences)  # the whole request, or none of it
        except (ValueError, QueueFullError) as e:
            raise _as_openai_error(e) from None
        if params.stop:  # the stop strings' automaton, built here rather than on the engine thread
            await self.tokenizers.run(lambda _: params.stop_matcher())
        if params.structured_outputs is not None:  # parsed here too: the engine reuses the parse
            await self._parse_constraint(params.structured_outputs)
        if self.options.enable_log_requests:
            logger.info("request %s: prompt tokens %s, adapter %s, priority %d, %s", request_id,
                        [len(p["prompt_token_ids"]) for p in prompts],
                        None if lora_request is None else lora_request.lora_name, priority, params)
        streams = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.engine.add_request(f"{request_id}-{i}", prompt, params, lora_request,
                                                             priority))
        except BaseException as e:
            for stream in streams:
                stream.close()
            raise _as_openai_error(e) from e
        return streams

    async def _parse_constraint(self, constraint) -> None:
        """A 400 naming the request field when the schema, regex or grammar does not parse (or xgrammar is not
        installed)."""
        try:
            await self.tokenizers.run(lambda _: constraint.parsed())
        except (ValueError, ImportError) as e:
            raise bad_request(f"{constraint.source_field}: {e}", constraint.source_field) from None

    @staticmethod
    async def collect(outputs: AsyncIterator, consume) -> None:
        """consume(item) for each item of `outputs` (a non-streamed response); engine failures become
        OpenAIErrors."""
        try:
            async for item in outputs:
                consume(*item)
        except (EngineDeadError, RequestFailedError) as e:
            raise _as_openai_error(e) from e


def _as_openai_error(e: BaseException) -> BaseException:
    if isinstance(e, AdapterRemovedError):  # unloaded while the request was on its way
        return OpenAIError(404, f"the model does not exist any more: {e}", "model", "model_not_found")
    if isinstance(e, ValueError):
        return bad_request(str(e), _field_named_in(str(e)))
    if isinstance(e, QueueFullError):
        return OpenAIError(429, str(e), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, str(e), code="engine_dead")
    if isinstance(e, RequestFailedError):
        return OpenAIError(500, str(e), code="request_failed")
    return e


def _field_named_in(message: str) -> str | None:
    """The field a SamplingParams/engine message starts with ("top_p must be ..."), if any."""
    head = message.split(" ", 1)[0].split("[", 1)[0].rstrip(":")
    if head == "prompt_token_ids":
        return "prompt"
    return head if head in _FIELDS else None


_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} | {"prompt", "top_logprobs", "messages", "priority"} | \
    set(StructuredOutputFields.model_fields)


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(error: OpenAIError) -> str:
    return sse(json.dumps({"error": {"message": error.message, "type": "server_error", "param": error.param,
                                     "code": error.status}}))


def stream_failure(e: BaseException) -> str:
    """The SSE error event for a stream that failed after its 200 was sent."""
    if isinstance(e, EngineDeadError):
        return sse_error(OpenAIError(503, str(e)))
    logger.error("a stream failed", exc_info=e)
    return sse_error(OpenAIError(500, f"the request failed: {e!r}"))


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several request streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                await queue.put((index, output))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, e))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.close()


def timing_metrics(times: RequestMetrics, num_generated: int) -> PerRequestMetrics:
    """vLLM's per-request timing from the engine's clock readings (a field is None without its readings)."""
    def ms(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else (end - start) * 1e3

    decode = ms(times.first_token_time, times.last_token_time)
    inference = ms(times.first_scheduled_time, times.last_token_time)
    return PerRequestMetrics(
        time_to_first_token_ms=ms(times.first_scheduled_time, times.first_token_time), generation_time_ms=decode,
        queue_time_ms=ms(times.arrival_time, times.first_scheduled_time),
        mean_itl_ms=decode / (num_generated - 1) if decode is not None and num_generated > 1 else None,
        tokens_per_second=num_generated / inference * 1e3 if inference else None)


def token_text(logprob: Logprob | None, tokenizer, token_id: int, as_id: bool = False) -> str:
    """A logprob entry's token as responses write it: its text, or "token_id:<id>" (as_id, or no tokenizer)."""
    if as_id:
        return f"token_id:{token_id}"
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"


def prompt_logprobs_field(entries: list[dict[int, Logprob] | None] | None, tokenizer) -> list | None:
    """A RequestOutput's prompt logprobs as responses carry them (vLLM's shape: per prompt token, the first
    None, {token id: {logprob, rank, decoded_token}})."""
    if entries is None:
        return None
    return [None if entry is None else
            {tid: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=token_text(lp, tokenizer, tid))
             for tid, lp in entry.items()} for entry in entries]


def sampled_and_top(entry: dict[int, Logprob], token_id: int, top_n: int | None):
    """(the sampled token's Logprob, the top_n alternatives as (id, Logprob) by rank); top_n None: every entry
    (logprob_token_ids: the asked ids, in their order, and the sampled token)."""
    ranked = sorted(entry.items(), key=lambda kv: (kv[1].rank or 0))
    return entry[token_id], ranked[:top_n]
