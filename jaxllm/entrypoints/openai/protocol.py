"""Request and response bodies of the OpenAI-compatible API (the OpenAI field names, plus vLLM's extras)."""

from __future__ import annotations

import json
import time
import uuid
from types import MappingProxyType
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jaxllm.entrypoints.openai.structured_fields import StructuredOutputFields
from jaxllm.errors import lone_surrogate, printable
from jaxllm.sampling_params import SamplingParams


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as the OpenAI API does


# ---------------------------------------------------------------------------------------------- errors
class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# ---------------------------------------------------------------------------------------------- requests
class RequestModel(OpenAIBaseModel):
    """A request body: besides its fields' types, no text in it may hold a lone UTF-16 surrogate (valid JSON,
    "\\ud800", but not Unicode: no tokenizer can encode it)."""

    @model_validator(mode="before")
    @classmethod
    def _reject_lone_surrogates(cls, data: Any) -> Any:
        path = lone_surrogate_path(data)
        if path is not None:
            raise ValueError(f"{path}: the text holds a lone UTF-16 surrogate, which is not valid Unicode")
        return data


def lone_surrogate_path(data: Any) -> str | None:
    """Where in a parsed JSON value ("messages[0].content") a string holds a lone surrogate, or None; a key
    holding one is named with it escaped."""
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and lone_surrogate(value) is not None:
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                key_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and lone_surrogate(key) is not None:
                    return printable(key_path)
                stack.append((key_path, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False  # a last chunk carrying the usage (vLLM's default: off)
    continuous_usage_stats: bool = False  # with include_usage: every chunk carries the usage so far


class SamplingRequest(RequestModel, StructuredOutputFields):
    """Fields shared by completions and chat completions (structured outputs: structured_fields.py)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    best_of: int | None = None  # sample this many, return the n with the highest cumulative logprob
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)  # int64, as vLLM
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # vLLM's extras
    request_id: str | None = None  # names the response (its id); the engine's own ids stay unique
    prompt_logprobs: int | None = None  # top logprobs per prompt token (not with stream)
    truncate_prompt_tokens: int | None = None  # keep this many prompt tokens (-1: max_model_len)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logprob_token_ids: list[int] | None = None  # report these ids' logprobs instead of the top-N
    priority: int = 0  # lower runs first (the server's --scheduling-policy priority)
    return_token_ids: bool | None = None  # choices carry prompt_token_ids and token_ids
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as "token_id:<id>" (None: the server's flag)
    truncation_side: Literal["left", "right"] = "left"  # left: the prompt's last tokens are kept
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    use_beam_search: bool = False  # n beams; the n best hypotheses are the choices (beam_search.py)
    length_penalty: float = 1.0  # beam search: hypotheses ranked by cum_logprob / generated_len ** length_penalty

    def requested_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        defaults: Mapping[str, Any] = MappingProxyType({})) -> SamplingParams:
        """SamplingParams of this request; raises ValueError naming a bad field. defaults: what the optional
        sampling fields and max_tokens take when the request leaves them unset (None), before SamplingParams' own
        defaults (the server's generation config, vLLM's default_sampling_params)."""
        bias = None if self.logit_bias is None else _token_keys(self.logit_bias)
        optional = dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                        repetition_penalty=self.repetition_penalty)
        optional = {name: defaults.get(name) if value is None else value for name, value in optional.items()}
        max_tokens = defaults.get("max_tokens") if max_tokens is None else max_tokens
        return SamplingParams(
            n=self.n, best_of=self.best_of, max_tokens=max_tokens, stop=self.stop, seed=self.seed, logit_bias=bias,
            logprobs=logprobs, prompt_logprobs=self.requested_prompt_logprobs(),
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids,
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            logprob_token_ids=self.logprob_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            structured_outputs=self.structured_outputs_params(),
            **{k: v for k, v in optional.items() if v is not None})

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "SamplingRequest":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.prompt_logprobs and self.stream:
            raise ValueError("prompt_logprobs: not available when stream is true")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1 \
                and self.truncate_prompt_tokens != -1:
            raise ValueError(f"truncate_prompt_tokens: must be -1 or >= 1, got {self.truncate_prompt_tokens}")
        return self

    def truncated(self, prompt: dict, max_model_len: int) -> dict:
        """A prompt dict cut to truncate_prompt_tokens tokens (its text dropped: it no longer matches)."""
        keep = max_model_len if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        ids = prompt["prompt_token_ids"]
        if keep is None or len(ids) <= keep:
            return prompt
        return {"prompt_token_ids": ids[-keep:] if self.truncation_side == "left" else ids[:keep]}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats

    def response_id(self, prefix: str) -> str:
        return random_id(prefix) if self.request_id is None else f"{prefix}-{self.request_id}"


def _token_keys(bias: dict[str, float]) -> dict[int, float]:
    """logit_bias keyed by token ids; ValueError naming every key that is not one."""
    bad = [key for key in bias if not key.strip().lstrip("-").isdigit()]
    if bad:
        raise ValueError(f"logit_bias keys must be token ids, got {', '.join(map(repr, bad))}")
    return {int(key): value for key, value in bias.items()}


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]

    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("prompt") is None:
            raise ValueError("prompt: Either prompt or prompt_embeds must be provided and non-empty (prompt_embeds "
                             "is not supported here)")
        return data
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    def requested_prompt_logprobs(self) -> int | None:
        """With echo, logprobs also cover the prompt (vLLM, OpenAI)."""
        if self.prompt_logprobs is None and self.echo:
            return self.logprobs
        return self.prompt_logprobs

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        return list(prompt) if prompt else [[]]  # an empty list is an empty prompt, rejected by the engine


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):  # content parts: only text is supported
            parts = []
            for part in content:
                if part.get("type") != "text":
                    raise ValueError(f"message content parts of type {part.get('type')!r} are not supported; "
                                     f"only 'text'")
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [_template_tool_call(call) for call in self.tool_calls]
        return message


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as chat templates read it: its arguments as an object where they are a JSON object's text
    (templates write them with tojson; as vLLM does)."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # left as sent
    return {**call, "function": function}


class ChatTemplateOptions(RequestModel):
    """How the chat template renders the messages (vLLM's fields)."""

    add_generation_prompt: bool = True  # end with the assistant's turn opened
    continue_final_message: bool = False  # leave the last message open: the reply continues it
    chat_template: str | None = None  # the request's own template (the server's --trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None  # values of the template's variables
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions, laid out by the template

    @model_validator(mode="after")
    def _one_ending(self) -> "ChatTemplateOptions":
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message: cannot be used with add_generation_prompt (set it false)")
        return self

    def template_options(self) -> dict:
        return dict(add_generation_prompt=self.add_generation_prompt,
                    continue_final_message=self.continue_final_message)


class ChatCompletionRequest(SamplingRequest, ChatTemplateOptions):
    messages: list[ChatMessage] = Field(min_length=1)
    tool_choice: str | dict[str, Any] | None = None  # unset: "auto" with tools, else "none" (vLLM's)
    parallel_tool_calls: bool | None = None  # tool_choice "required": more than one call allowed (default true)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    echo: bool = False  # the reply starts with the last message's content when that message is the assistant's

    def echoed_text(self) -> str:
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return ""
        return last.as_template_input()["content"]

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise ValueError("top_logprobs needs logprobs=true")
            return None
        return self.top_logprobs or 0


class TokenizeRequest(ChatTemplateOptions):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False  # also the tokens' strings (token_strs)


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]


class LoadLoRAAdapterRequest(RequestModel):
    """POST /v1/load_lora_adapter: serve the PEFT directory lora_path under the model name lora_name."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(RequestModel):
    lora_name: str


# ---------------------------------------------------------------------------------------------- responses
def omitted_when_none():
    """A response field that is left out, not sent as null, when it has no value (vLLM's token-id fields: a
    stream's later chunks carry no prompt_token_ids key)."""
    return Field(None, exclude_if=lambda value: value is None)


class PromptTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = omitted_when_none()  # --enable-prompt-tokens-details


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> UsageInfo:
    """cached_tokens: with --enable-prompt-tokens-details, the prompt tokens the prefix cache served."""
    details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)


class CompletionLogprobs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobsField = list[dict[int, PromptLogprob] | None] | None  # per prompt token, the first null (vLLM)


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobsField = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    token_ids: list[int] | None = None  # return_token_ids: the generated ids


class CompletionStreamChoice(CompletionChoice):
    prompt_token_ids: list[int] | None = omitted_when_none()  # return_token_ids: on the choice's first chunk
    token_ids: list[int] | None = omitted_when_none()  # return_token_ids: this chunk's new ids


class PerRequestMetrics(OpenAIBaseModel):
    """--enable-per-request-metrics (vLLM's): one request's timing, in milliseconds; a time its clock readings do
    not give (the mean inter-token latency of one token) is left out."""

    time_to_first_token_ms: float | None = omitted_when_none()  # first scheduled to first token
    generation_time_ms: float | None = omitted_when_none()  # first token to last token
    queue_time_ms: float | None = omitted_when_none()  # arrival to first scheduled
    mean_itl_ms: float | None = omitted_when_none()  # generation time per token after the first (2+ tokens)
    tokens_per_second: float | None = omitted_when_none()  # generated tokens over first scheduled to last token


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    metrics: PerRequestMetrics | None = omitted_when_none()


class CompletionStreamResponse(CompletionResponse):
    choices: list[CompletionStreamChoice]
    metrics: PerRequestMetrics | None = omitted_when_none()  # on the usage chunk


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIBaseModel):
    content: list[ChatLogprobToken] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = omitted_when_none()  # --reasoning-parser: the reply's reasoning
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)  # as vLLM: empty when none


class ChatChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobsField = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    metrics: PerRequestMetrics | None = omitted_when_none()


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = omitted_when_none()
    tool_calls: list[dict[str, Any]] | None = omitted_when_none()  # OpenAI's tool-call deltas


class ChatStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = omitted_when_none()  # return_token_ids: this chunk's new ids


class ChatCompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = omitted_when_none()  # return_token_ids: on the first chunk only
    metrics: PerRequestMetrics | None = omitted_when_none()  # on the usage chunk


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "jaxllm"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (its served name); null for a base model
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
