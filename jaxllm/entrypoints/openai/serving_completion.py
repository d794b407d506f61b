"""POST /v1/completions: one engine request per prompt, n samples each; choice index = prompt * n + sample. The
request's `model` may name a LoRA adapter: every prompt then runs with it, and the response names it."""

from __future__ import annotations

from typing import AsyncIterator

from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, \
    CompletionResponse, random_id, usage
from jaxllm.entrypoints.openai.serving_base import SSE_DONE, ServingBase, merge, sampled_and_top, sse, \
    stream_failure, token_text
from jaxllm.outputs import CompletionOutput, RequestOutput

DEFAULT_MAX_TOKENS = 16  # the OpenAI default for completions


class CompletionServing(ServingBase):
    async def create(self, request: CompletionRequest) -> CompletionResponse | AsyncIterator[str]:
        lora_request = self.check_model(request.model)
        if request.suffix:
            raise OpenAIError(400, "suffix is not supported", "suffix")
        max_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        params = self.sampling_params(request, max_tokens, request.logprobs)
        prompts = [{"prompt_token_ids": p} if isinstance(p, list) else await self.encode_prompt(p)
                   for p in request.prompts()]
        request_id = random_id("cmpl")
        streams = await self.submit(request_id, prompts, params, lora_request)
        model = self.response_model(lora_request)
        if request.stream:
            return self._stream(request_id, request, streams, model)
        return await self._full(request_id, request, streams, model)

    async def _full(self, request_id: str, request: CompletionRequest, streams, model: str) -> CompletionResponse:
        n = request.n
        texts: dict[int, list[str]] = {}
        last: dict[int, CompletionOutput] = {}
        logprobs: dict[int, CompletionLogprobs] = {}
        prompt_ids: dict[int, list[int]] = {}
        generated = 0

        def consume(p: int, output: RequestOutput) -> None:
            nonlocal generated
            prompt_ids[p] = output.prompt_token_ids
            for completion in output.outputs:
                index = p * n + completion.index
                if index not in texts:
                    texts[index] = [self._echo(request, output)]
                texts[index].append(completion.text)
                generated += len(completion.token_ids)
                if request.logprobs is not None:
                    self._add_logprobs(logprobs.setdefault(index, CompletionLogprobs()), completion,
                                       request.logprobs, sum(map(len, texts[index][:-1])))
                last[index] = completion

        await self.collect(merge(streams), consume)
        choices = [CompletionChoice(index=i, text="".join(texts[i]), logprobs=logprobs.get(i),
                                    finish_reason=last[i].finish_reason, stop_reason=last[i].stop_reason)
                   for i in sorted(texts)]
        prompt_tokens = sum(len(ids) for ids in prompt_ids.values())
        return CompletionResponse(id=request_id, model=model, choices=choices, usage=usage(prompt_tokens, generated))

    async def _stream(self, request_id: str, request: CompletionRequest, streams, model: str) -> AsyncIterator[str]:
        n = request.n
        sent_chars: dict[int, int] = {}  # per choice: characters of text sent so far (logprob text offsets)
        prompt_tokens, generated = {}, 0
        try:
            async for p, output in merge(streams):
                prompt_tokens[p] = len(output.prompt_token_ids)
                for completion in output.outputs:
                    index = p * n + completion.index
                    text = completion.text
                    if index not in sent_chars:
                        echo = self._echo(request, output)
                        text, sent_chars[index] = echo + text, len(echo)
                    generated += len(completion.token_ids)
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = CompletionLogprobs()
                        self._add_logprobs(logprobs, completion, request.logprobs, sent_chars[index])
                    sent_chars[index] += len(completion.text)
                    choice = CompletionChoice(index=index, text=text, logprobs=logprobs,
                                              finish_reason=completion.finish_reason,
                                              stop_reason=completion.stop_reason)
                    yield sse(CompletionResponse(id=request_id, model=model, choices=[choice]))
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the failure travels as an error event
            yield stream_failure(e)
        if request.include_usage:
            yield sse(CompletionResponse(id=request_id, model=model, choices=[],
                                         usage=usage(sum(prompt_tokens.values()), generated)))
        yield SSE_DONE

    def _echo(self, request: CompletionRequest, output: RequestOutput) -> str:
        if not request.echo:
            return ""
        if output.prompt is not None:
            return output.prompt
        return self.tokenizer.decode(output.prompt_token_ids) if self.tokenizer is not None else ""

    def _add_logprobs(self, into: CompletionLogprobs, completion: CompletionOutput, top_n: int,
                      offset: int) -> None:
        for token_id, entry in zip(completion.token_ids, completion.logprobs or []):
            sampled, top = sampled_and_top(entry, token_id, top_n)
            text = token_text(sampled, self.tokenizer, token_id)
            into.text_offset.append(offset)
            into.tokens.append(text)
            into.token_logprobs.append(sampled.logprob)
            into.top_logprobs.append({token_text(lp, self.tokenizer, tid): lp.logprob for tid, lp in top}
                                     if top_n else None)
            offset += len(text)
