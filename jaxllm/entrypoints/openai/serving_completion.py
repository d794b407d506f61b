"""POST /v1/completions: one engine request per prompt, n samples each; choice index = prompt * n + sample. The
request's `model` may name a LoRA adapter: every prompt then runs with it, and the response names it."""

from __future__ import annotations

from typing import AsyncIterator

from jaxllm.entrypoints.openai.beam_search import beam_search_streams
from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, \
    CompletionResponse, CompletionStreamChoice, CompletionStreamResponse, UsageInfo, random_id, usage
from jaxllm.entrypoints.openai.serving_base import SSE_DONE, ServingBase, merge, prompt_logprobs_field, \
    sampled_and_top, sse, stream_failure, token_text
from jaxllm.outputs import CompletionOutput, RequestOutput

DEFAULT_MAX_TOKENS = 16  # the OpenAI default for completions (vLLM's too: a generation config's max_new_tokens
# is the default of chat completions only)


class CompletionServing(ServingBase):
    async def create(self, request: CompletionRequest) -> CompletionResponse | AsyncIterator[str]:
        lora_request = self.check_model(request.model)
        if request.suffix:
            raise OpenAIError(400, "suffix is not supported", "suffix")
        max_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        params = self.sampling_params(request, max_tokens, request.logprobs)
        prompts = [request.truncated({"prompt_token_ids": p} if isinstance(p, list) else await self.encode_prompt(p),
                                     self.max_model_len) for p in request.prompts()]
        if request.use_beam_search:
            streams = beam_search_streams(self, random_id("cmpl"), request, prompts, params, max_tokens, lora_request)
        else:
            streams = await self.submit(random_id("cmpl"), prompts, params, lora_request, request.priority)
        request_id, model = request.response_id("cmpl"), self.response_model(lora_request)
        if request.stream:
            return self._stream(request_id, request, streams, model)
        return await self._full(request_id, request, streams, model)

    async def _full(self, request_id: str, request: CompletionRequest, streams, model: str) -> CompletionResponse:
        n = request.n
        texts: dict[int, list[str]] = {}
        last: dict[int, CompletionOutput] = {}
        logprobs: dict[int, CompletionLogprobs] = {}
        prompt_ids: dict[int, list[int]] = {}
        prompt_logprobs: dict[int, list | None] = {}
        cached: dict[int, int] = {}
        outputs: dict[int, RequestOutput] = {}  # per prompt, its last output
        token_ids: dict[int, list[int]] = {}
        as_id = self.tokens_as_ids(request)
        generated = 0

        def consume(p: int, output: RequestOutput) -> None:
            nonlocal generated
            prompt_ids[p], prompt_logprobs[p] = output.prompt_token_ids, output.prompt_logprobs
            cached[p], outputs[p] = output.num_cached_tokens, output
            for completion in output.outputs:
                index = p * n + completion.index
                if index not in texts:
                    texts[index] = [self._echo(request, output)]
                    if request.echo and request.logprobs is not None:
                        self._add_prompt_logprobs(logprobs.setdefault(index, CompletionLogprobs()), output,
                                                  request.logprobs, as_id)
                texts[index].append(completion.text)
                token_ids.setdefault(index, []).extend(completion.token_ids)
                generated += len(completion.token_ids)
                if request.logprobs is not None:
                    self._add_logprobs(logprobs.setdefault(index, CompletionLogprobs()), completion,
                                       request.logprobs, sum(map(len, texts[index][:-1])), as_id,
                                       bool(request.logprob_token_ids))
                last[index] = completion

        await self.collect(merge(streams), consume)
        per_prompt = {p: prompt_logprobs_field(entries, self.tokenizer) for p, entries in prompt_logprobs.items()}
        ids = request.return_token_ids
        choices = [CompletionChoice(index=i, text="".join(texts[i]), logprobs=logprobs.get(i),
                                    finish_reason=last[i].finish_reason, stop_reason=last[i].stop_reason,
                                    prompt_logprobs=per_prompt[i // n],
                                    prompt_token_ids=prompt_ids[i // n] if ids else None,
                                    token_ids=token_ids[i] if ids else None)
                   for i in sorted(texts)]
        prompt_tokens = sum(len(ids) for ids in prompt_ids.values())
        return CompletionResponse(id=request_id, model=model, choices=choices,
                                  usage=usage(prompt_tokens, generated, self.cached_tokens(sum(cached.values()))),
                                  metrics=self.request_metrics(list(outputs.values()), n, generated))

    async def _stream(self, request_id: str, request: CompletionRequest, streams, model: str) -> AsyncIterator[str]:
        n = request.n
        sent_chars: dict[int, int] = {}  # per choice: characters of text sent so far (logprob text offsets)
        prompt_tokens, cached, generated = {}, {}, 0
        last: dict[int, RequestOutput] = {}  # per prompt, its last output
        as_id, ids = self.tokens_as_ids(request), request.return_token_ids
        include_usage, continuous_usage = self.stream_usage(request)

        def usage_so_far() -> UsageInfo:
            return usage(sum(prompt_tokens.values()), generated, self.cached_tokens(sum(cached.values())))

        try:
            async for p, output in merge(streams):
                prompt_tokens[p], cached[p], last[p] = len(output.prompt_token_ids), output.num_cached_tokens, output
                for completion in output.outputs:
                    index = p * n + completion.index
                    text, first = completion.text, index not in sent_chars
                    if first:
                        echo = self._echo(request, output)
                        text, sent_chars[index] = echo + text, len(echo)
                    generated += len(completion.token_ids)
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = CompletionLogprobs()
                        if first and request.echo:
                            self._add_prompt_logprobs(logprobs, output, request.logprobs, as_id)
                        self._add_logprobs(logprobs, completion, request.logprobs, sent_chars[index], as_id,
                                           bool(request.logprob_token_ids))
                    sent_chars[index] += len(completion.text)
                    choice = CompletionStreamChoice(
                        index=index, text=text, logprobs=logprobs, finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        prompt_token_ids=output.prompt_token_ids if ids and first else None,
                        token_ids=completion.token_ids if ids else None)
                    so_far = usage_so_far() if continuous_usage else None
                    yield sse(CompletionStreamResponse(id=request_id, model=model, choices=[choice], usage=so_far))
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the failure travels as an error event
            yield stream_failure(e)
        if include_usage:
            yield sse(CompletionStreamResponse(id=request_id, model=model, choices=[], usage=usage_so_far(),
                                               metrics=self.request_metrics(list(last.values()), n, generated)))
        yield SSE_DONE

    def _echo(self, request: CompletionRequest, output: RequestOutput) -> str:
        if not request.echo:
            return ""
        if output.prompt is not None:
            return output.prompt
        return self.tokenizer.decode(output.prompt_token_ids) if self.tokenizer is not None else ""

    def _add_logprobs(self, into: CompletionLogprobs, completion: CompletionOutput, top_n: int,
                      offset: int, as_id: bool, every_entry: bool = False) -> None:
        """every_entry: logprob_token_ids asked for: each position's entries are those ids and the sampled token."""
        self._add_entries(into, completion.token_ids, completion.logprobs or [], None if every_entry else top_n,
                          offset, as_id)

    def _add_prompt_logprobs(self, into: CompletionLogprobs, output: RequestOutput, top_n: int,
                             as_id: bool) -> None:
        """The echoed prompt's tokens (the first has no logprob: nothing predicts it), from offset 0."""
        self._add_entries(into, output.prompt_token_ids, output.prompt_logprobs or [], top_n, 0, as_id)

    def _add_entries(self, into: CompletionLogprobs, token_ids, entries, top_n: int | None, offset: int,
                     as_id: bool) -> None:
        """Per token: its text (or "token_id:<id>"), offset, logprob and top logprobs, the token itself first
        and then the top_n (vLLM: logprobs=0 still gives the token's own)."""
        for token_id, entry in zip(token_ids, entries):
            if entry is None:
                text, logprob, top = token_text(None, self.tokenizer, token_id, as_id), None, None
            else:
                sampled, ranked = sampled_and_top(entry, token_id, top_n)
                text, logprob = token_text(sampled, self.tokenizer, token_id, as_id), sampled.logprob
                top = {text: logprob} | {token_text(lp, self.tokenizer, tid, as_id): lp.logprob
                                         for tid, lp in ranked}
            into.text_offset.append(offset)
            into.tokens.append(text)
            into.token_logprobs.append(logprob)
            into.top_logprobs.append(top)
            offset += len(text)
