"""POST /v1/chat/completions: the messages rendered by the model's chat template, n samples of the reply. The
request's `model` may name a LoRA adapter (the base model's chat template still renders the messages)."""

from __future__ import annotations

import re
from typing import AsyncIterator

from jinja2 import TemplateError

from jaxllm.entrypoints.openai.beam_search import beam_search_streams
from jaxllm.entrypoints.openai.chat_options import ChatOptions
from jaxllm.entrypoints.openai.chat_reply import Reply, ReplyReader, ReplyStream
from jaxllm.entrypoints.openai.errors import bad_request
from jaxllm.entrypoints.openai.protocol import ChatChoice, ChatCompletionChunk, ChatCompletionRequest, \
    ChatCompletionResponse, ChatTemplateOptions, ChatLogprobs, ChatLogprobToken, ChatResponseMessage, ChatStreamChoice, DeltaMessage, \
    TopLogprob, UsageInfo, random_id, usage
from jaxllm.entrypoints.openai.serving_base import SSE_DONE, ServingBase, merge, prompt_logprobs_field, \
    sampled_and_top, sse, stream_failure, token_text
from jaxllm.outputs import CompletionOutput
from jaxllm.structured_outputs import StructuredOutputsParams
from jaxllm.tool_calling import ContentDelta, ReasoningDelta, ToolCallDelta


class ChatServing(ServingBase):
    request_kind = "chat"

    def __init__(self, *args, chat: ChatOptions = ChatOptions(), **kwargs):
        """chat: the server's chat settings (chat_options.py)."""
        super().__init__(*args, **kwargs)
        self.chat = chat

    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | AsyncIterator[str]:
        lora_request = self.check_model(request.model)
        try:
            logprobs = request.requested_logprobs()
        except ValueError as e:
            raise bad_request(str(e), "top_logprobs") from None
        params = self.sampling_params(request, request.requested_max_tokens(), logprobs,
                                      "max_tokens" if request.max_completion_tokens is None else
                                      "max_completion_tokens")
        reader = self._reply_reader(request, params)
        prompt = request.truncated({"prompt_token_ids": await self.render(request)}, self.max_model_len)
        prompt_ids = prompt["prompt_token_ids"]
        if request.requested_max_tokens() is None:
            params = self.fit_default_max_tokens(params, len(prompt_ids))
        if request.use_beam_search:
            streams = beam_search_streams(self, random_id("chatcmpl"), request, [{"prompt_token_ids": prompt_ids}],
                                          params, params.max_tokens, lora_request)
        else:
            streams = await self.submit(random_id("chatcmpl"), [{"prompt_token_ids": prompt_ids}], params,
                                        lora_request, request.priority)
        request_id, model = request.response_id("chatcmpl"), self.response_model(lora_request)
        if request.stream:
            return self._stream(request_id, request, streams, model, prompt_ids, reader)
        return await self._full(request_id, request, streams, model, reader)

    def _reply_reader(self, request: ChatCompletionRequest, params) -> ReplyReader | None:
        """How the reply is read (tools, reasoning); a forced tool_choice constrains params to its JSON schema.
        With a reasoning parser (and thinking on) a constraint applies to the answer after </think> only."""
        try:
            reader, schema = self.chat.reply_reader(request.tools, request.tool_choice, request.parallel_tool_calls,
                                                    self.chat.kwargs_for(request.chat_template_kwargs))
        except ValueError as e:
            raise bad_request(str(e), re.match(r"\w+", str(e)).group(0)) from None
        if schema is not None:
            if params.structured_outputs is not None:
                raise bad_request(f"tool_choice: {request.tool_choice!r} constrains the reply to a tool call; it "
                                  f"cannot be combined with {params.structured_outputs.source_field}",
                                  "tool_choice")
            constraint = StructuredOutputsParams(json=schema, disable_any_whitespace=True)  # compact: no runaway
            constraint.source_field = "tools"                                                # whitespace
            constraint.close_within_budget = True  # the calls end complete even where the budget cuts the reply
            params.structured_outputs = self.structured_outputs_config.apply(constraint)
        if params.structured_outputs is not None and reader is not None and reader.reasoning is not None \
                and reader.enable_thinking:
            params.structured_outputs.reasoning_end = reader.reasoning.end  # the answer is constrained, not the
            #                                                                  reasoning before it
        if reader is not None and reader.tool_parser is not None and reader.tool_parser.name == "mistral":
            params.skip_special_tokens = False  # [TOOL_CALLS] and [ARGS] are special tokens
        return reader

    async def render(self, request: ChatTemplateOptions) -> list[int]:
        """The request's messages through the chat template (the server's, or the request's own when trusted), with
        its template variables and tools, under the template's bounds."""
        if not self.tokenizers.available:
            raise bad_request("chat needs a tokenizer; this server runs without one", "messages")
        try:
            options = dict(request.template_options(), chat_template=self.chat.template_for(request.chat_template),
                           template_kwargs=self.chat.kwargs_for(request.chat_template_kwargs), tools=request.tools)
        except ValueError as e:
            raise bad_request(str(e), re.match(r"\w+", str(e)).group(0)) from None
        try:
            conversation = [m.as_template_input() for m in request.messages]
            return await self.tokenizers.chat_prompt_ids(conversation, **options)
        except ValueError as e:
            raise bad_request(str(e), "messages") from None
        except TemplateError as e:  # the template rejects these messages, or the template itself is broken
            raise bad_request(f"the chat template failed on these messages: {type(e).__name__}: {e}",
                              "messages") from None

    async def _full(self, request_id: str, request: ChatCompletionRequest, streams, model: str,
                    reader: ReplyReader | None) -> ChatCompletionResponse:
        texts: dict[int, list[str]] = {}
        token_ids: dict[int, list[int]] = {}
        last: dict[int, CompletionOutput] = {}
        logprobs: dict[int, list[ChatLogprobToken]] = {}
        generated = 0
        prompt = None

        def consume(_, output) -> None:
            nonlocal generated, prompt
            prompt = output
            for completion in output.outputs:
                texts.setdefault(completion.index, []).append(completion.text)
                token_ids.setdefault(completion.index, []).extend(completion.token_ids)
                generated += len(completion.token_ids)
                logprobs.setdefault(completion.index, []).extend(self._logprobs(completion, request))
                last[completion.index] = completion

        await self.collect(merge(streams), consume)
        echo, ids = request.echoed_text(), request.return_token_ids
        choices = []
        for i in sorted(texts):
            reply = Reply(None, echo + "".join(texts[i]), []) if reader is None else reader.whole(
                echo + "".join(texts[i]))
            finish = last[i].finish_reason if reader is None else reader.finish_reason(last[i].finish_reason,
                                                                                       len(reply.tool_calls))
            message = ChatResponseMessage(content=reply.content, reasoning_content=reply.reasoning_content,
                                          tool_calls=[call.to_openai() for call in reply.tool_calls])
            choices.append(ChatChoice(index=i, message=message, finish_reason=finish, stop_reason=last[i].stop_reason,
                                      logprobs=ChatLogprobs(content=logprobs[i]) if request.logprobs else None,
                                      token_ids=token_ids[i] if ids else None))
        return ChatCompletionResponse(
            id=request_id, model=model, choices=choices,
            usage=usage(len(prompt.prompt_token_ids), generated, self.cached_tokens(prompt.num_cached_tokens)),
            prompt_logprobs=prompt_logprobs_field(prompt.prompt_logprobs, self.tokenizer),
            prompt_token_ids=prompt.prompt_token_ids if ids else None,
            metrics=self.request_metrics([prompt], request.n, generated))

    async def _stream(self, request_id: str, request: ChatCompletionRequest, streams, model: str,
                      prompt_ids: list[int], reader: ReplyReader | None) -> AsyncIterator[str]:
        ids = request.return_token_ids
        replies: dict[int, ReplyStream] = {}  # per choice: its text read for reasoning and tool calls
        include_usage, continuous_usage = self.stream_usage(request)
        generated, cached, last = 0, 0, None

        def chunk(choices, usage_info=None, **fields) -> str:
            return sse(ChatCompletionChunk(id=request_id, model=model, choices=choices, usage=usage_info, **fields))

        def usage_so_far() -> UsageInfo:
            return usage(len(prompt_ids), generated, self.cached_tokens(cached))

        def no_tokens() -> list[int] | None:
            return [] if ids else None

        yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""),
                                      token_ids=no_tokens()) for i in range(request.n)],
                    usage_so_far() if continuous_usage else None, prompt_token_ids=prompt_ids if ids else None)
        if echo := request.echoed_text():  # read as the reply's start, as in the non-streamed reply
            yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(content=echo) if reader is None else
                                          _delta_message(replies.setdefault(i, reader.stream()).feed(echo)),
                                          token_ids=no_tokens()) for i in range(request.n)],
                        usage_so_far() if continuous_usage else None)
        try:
            async for _, output in merge(streams):
                cached, last = output.num_cached_tokens, output
                for completion in output.outputs:
                    generated += len(completion.token_ids)
                    logprobs = ChatLogprobs(content=self._logprobs(completion, request)) if request.logprobs \
                        else None
                    delta, finish = DeltaMessage(content=completion.text), completion.finish_reason
                    if reader is not None:
                        delta, finish = _read_delta(replies.setdefault(completion.index, reader.stream()),
                                                    completion)
                    yield chunk([ChatStreamChoice(index=completion.index, delta=delta, logprobs=logprobs,
                                                  finish_reason=finish, stop_reason=completion.stop_reason,
                                                  token_ids=completion.token_ids if ids else None)],
                                usage_so_far() if continuous_usage else None)
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the failure travels as an error event
            yield stream_failure(e)
        if include_usage:
            yield chunk([], usage_so_far(), metrics=self.request_metrics([last], request.n, generated))
        yield SSE_DONE

    def _logprobs(self, completion: CompletionOutput, request: ChatCompletionRequest) -> list[ChatLogprobToken]:
        if not request.logprobs:
            return []
        top_n = None if request.logprob_token_ids else request.top_logprobs or 0
        as_id = self.tokens_as_ids(request)
        tokens = []
        for token_id, entry in zip(completion.token_ids, completion.logprobs or []):
            sampled, top = sampled_and_top(entry, token_id, top_n)
            text = token_text(sampled, self.tokenizer, token_id, as_id)
            tokens.append(ChatLogprobToken(token=text, logprob=sampled.logprob, bytes=list(text.encode()),
                                           top_logprobs=[_top(lp, tid, self.tokenizer, as_id) for tid, lp in top]))
        return tokens


def _read_delta(reply: ReplyStream, completion: CompletionOutput) -> tuple[DeltaMessage, str | None]:
    """The choice's new text read as reasoning, content and tool-call deltas (what is held back comes later);
    its finish_reason as the reader gives it."""
    deltas = reply.feed(completion.text)
    if completion.finish_reason is not None:
        deltas += reply.finish()
    finish = completion.finish_reason
    if finish is not None:
        finish = reply.reader.finish_reason(finish, reply.num_tool_calls)
    return _delta_message(deltas), finish


def _delta_message(deltas: list) -> DeltaMessage:
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta)) or None
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) or None
    calls = _tool_call_items([d for d in deltas if isinstance(d, ToolCallDelta)]) or None
    return DeltaMessage(content=content, reasoning_content=reasoning, tool_calls=calls)


def _tool_call_items(deltas: list[ToolCallDelta]) -> list[dict]:
    """A chunk's `tool_calls`: one item per call, its pieces in this chunk joined (the head's id and name kept)."""
    items: list[dict] = []
    for delta in deltas:
        if items and items[-1]["index"] == delta.index:
            items[-1]["function"]["arguments"] += delta.arguments
        else:
            items.append(delta.to_openai())
    return items


def _top(logprob, token_id: int, tokenizer, as_id: bool) -> TopLogprob:
    text = token_text(logprob, tokenizer, token_id, as_id)
    return TopLogprob(token=text, logprob=logprob.logprob, bytes=list(text.encode()))
