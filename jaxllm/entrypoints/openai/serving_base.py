"""What completions and chat share: the model check, request submission, SSE framing, logprob formats."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import AsyncIterator, Sequence

from pydantic import BaseModel

from jaxllm.entrypoints.openai.async_engine import AsyncEngine, EngineDeadError, QueueFullError, RequestStream
from jaxllm.entrypoints.openai.errors import OpenAIError, bad_request
from jaxllm.entrypoints.openai.protocol import SamplingRequest
from jaxllm.outputs import Logprob, RequestOutput
from jaxllm.sampling_params import SamplingParams

RETRY_AFTER_S = 1


class ServingBase:
    def __init__(self, engine: AsyncEngine, served_model_names: Sequence[str]):
        self.engine = engine
        self.tokenizer = engine.engine.tokenizer
        self.model_names = list(served_model_names)
        self.max_model_len = engine.engine.scheduler_config.max_model_len

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                                   f"{', '.join(map(repr, self.model_names))}", "model", "model_not_found")

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @staticmethod
    def sampling_params(request: SamplingRequest, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        try:
            return request.sampling_params(max_tokens, logprobs)
        except ValueError as e:
            raise bad_request(str(e), _field_named_in(str(e))) from None

    async def submit(self, request_id: str, prompts: list, params: SamplingParams) -> list[RequestStream]:
        """Submit every prompt; on any failure abort those already accepted and raise an OpenAIError."""
        streams = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.engine.add_request(f"{request_id}-{i}", prompt, params))
        except BaseException as e:
            for stream in streams:
                stream.close()
            raise _as_openai_error(e) from None
        return streams


def _as_openai_error(e: BaseException) -> BaseException:
    if isinstance(e, ValueError):
        return bad_request(str(e), _field_named_in(str(e)))
    if isinstance(e, QueueFullError):
        return OpenAIError(429, str(e), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, str(e), code="engine_dead")
    return e


def _field_named_in(message: str) -> str | None:
    """The field a SamplingParams/engine message starts with ("top_p must be ..."), if any."""
    head = message.split(" ", 1)[0].split("[", 1)[0]
    if head == "prompt_token_ids":
        return "prompt"
    return head if head in _FIELDS else None


_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} | {"prompt", "top_logprobs", "messages"}


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(error: OpenAIError) -> str:
    return sse(json.dumps({"error": {"message": error.message, "type": "server_error", "param": error.param,
                                     "code": error.status}}))


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


def token_text(logprob: Logprob, tokenizer, token_id: int) -> str:
    if logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"


def sampled_and_top(entry: dict[int, Logprob], token_id: int, top_n: int):
    """(the sampled token's Logprob, the top_n alternatives as (id, Logprob) by rank)."""
    ranked = sorted(entry.items(), key=lambda kv: (kv[1].rank or 0))
    return entry[token_id], ranked[:top_n]
