"""use_beam_search on /v1/completions and /v1/chat/completions (vLLM's fields: use_beam_search, length_penalty; n is
the beam width and the number of choices).

A prompt's search runs as a BeamSearchStream: each step submits one engine request per running beam (the beams of
every request in flight share the engine's steps) and, once the search ends, yields one finished RequestOutput
holding the n best hypotheses, best first, as vLLM's server does: token_ids and text are the generated tokens,
the EOS left out unless include_stop_str_in_output; finish_reason "stop" (EOS) or "length". A stream
(stream=true) therefore carries each choice whole, in one chunk, when the search ends.

Beam search reads none of the sampling fields (stop strings, penalties, top_p ...): a request setting one is
refused naming it, as is length_penalty without use_beam_search.
"""

from __future__ import annotations

import dataclasses
import time
from typing import AsyncIterator

from jaxllm import beam_search_steps
from jaxllm.beam_search import BeamSearchParams
from jaxllm.entrypoints.openai.errors import bad_request
from jaxllm.entrypoints.openai.protocol import SamplingRequest
from jaxllm.entrypoints.openai.serving_base import merge
from jaxllm.lora.request import LoRARequest
from jaxllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxllm.sampling_params import SamplingParams

# SamplingParams fields a beam search request may set: the rest must keep their defaults
_READ_BY_BEAM_SEARCH = {"n", "max_tokens", "temperature", "ignore_eos", "include_stop_str_in_output", "logprobs",
                        "skip_special_tokens", "spaces_between_special_tokens"}


def beam_search_streams(serving, request_id: str, request: SamplingRequest, prompts: list[dict],
                        params: SamplingParams, max_tokens: int | None,
                        lora_request: LoRARequest | None) -> list["BeamSearchStream"]:
    """One BeamSearchStream per prompt, each checked before any response byte is sent: a field beam search does
    not read, n beyond the widest beam, or a search past max_model_len is a 400 naming the field. max_tokens
    None: what the context leaves after each prompt."""
    sequences = len(prompts) * params.n
    if sequences > serving.limits.max_request_sequences:
        raise bad_request(f"prompt: {len(prompts)} prompts x {params.n} beams is {sequences} sequences; this "
                          f"server takes at most {serving.limits.max_request_sequences} per request", "prompt")
    eos = serving.engine.engine.eos_token_ids
    streams = []
    for i, prompt in enumerate(prompts):
        room = serving.max_model_len - len(prompt["prompt_token_ids"])
        beam = beam_search_params(request, params, room if max_tokens is None else max_tokens, eos)
        streams.append(BeamSearchStream(serving, f"{request_id}-{i}", prompt, beam, lora_request, request.priority,
                                        params.skip_special_tokens))
    return streams


def beam_search_params(request: SamplingRequest, params: SamplingParams, max_tokens: int,
                       eos_token_ids: tuple[int, ...]) -> BeamSearchParams:
    """The request's BeamSearchParams (beam_width = n), from its validated SamplingParams; a 400 naming the
    field for one beam search does not read, or a bad value."""
    unset = request.sampling_params(params.max_tokens, params.logprobs)  # without the generation config's values
    default = SamplingParams()
    for field in dataclasses.fields(SamplingParams):
        name = field.name
        if name not in _READ_BY_BEAM_SEARCH and getattr(unset, name) != getattr(default, name):
            source = getattr(unset.structured_outputs, "source_field", name) if name == "structured_outputs" else name
            raise bad_request(f"{source} is not supported with use_beam_search", source)
    try:
        beam = BeamSearchParams(beam_width=params.n, max_tokens=max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature, length_penalty=request.length_penalty,
                                include_stop_str_in_output=params.include_stop_str_in_output)
        beam.check_width(0 if beam.ignore_eos else len(eos_token_ids))
    except ValueError as e:
        message = str(e)
        field = message.split(" ", 1)[0]
        if field == "beam_width":
            message, field = "n" + message[len("beam_width"):] + " (n is the beam width)", "n"
        raise bad_request(message, field) from None
    return beam


class BeamSearchStream:
    """One prompt's search, as a request stream: iterating runs it and yields its one finished output."""

    def __init__(self, serving, request_id: str, prompt: dict, params: BeamSearchParams, lora_request, priority: int,
                 skip_special_tokens: bool):
        engine = serving.engine.engine
        self.serving, self.request_id, self.prompt, self.lora_request = serving, request_id, prompt, lora_request
        self.priority, self.skip_special_tokens = priority, skip_special_tokens
        self.eos = () if params.ignore_eos else engine.eos_token_ids
        self.step_params = beam_search_steps.step_sampling_params(params, self.eos)
        try:
            self.instance = beam_search_steps.new_instance(prompt["prompt_token_ids"], params, self.eos,
                                                           serving.max_model_len, lora_request)
        except ValueError as e:
            raise bad_request(str(e), "max_tokens") from None
        self.arrival = time.monotonic()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        step = 0
        while batch := beam_search_steps.step_prompts([self.instance]):
            outputs = await self._run_step(f"{self.request_id}-{step}", [tokens for _, tokens in batch])
            beam_search_steps.advance_all(batch, outputs)
            step += 1
        yield self._output()

    async def _run_step(self, step_id: str, beams: list[list[int]]) -> list[RequestOutput]:
        """Every running beam one engine request; each one's output with all of its logprobs."""
        streams = await self.serving.submit(step_id, [{"prompt_token_ids": t} for t in beams], self.step_params,
                                            self.lora_request, self.priority)
        finals: list[RequestOutput | None] = [None] * len(beams)
        logprobs: list[list] = [[] for _ in beams]

        def consume(i: int, output: RequestOutput) -> None:
            if output.outputs:
                logprobs[i].extend(output.outputs[0].logprobs or [])
            finals[i] = output

        await self.serving.collect(merge(streams), consume)
        return [dataclasses.replace(f, outputs=[dataclasses.replace(f.outputs[0] if f.outputs else _empty(),
                                                                    logprobs=lp)])
                for f, lp in zip(finals, logprobs)]

    def _output(self) -> RequestOutput:
        tokenizer = self.serving.tokenizer
        choices = []
        for i, sequence in enumerate(self.instance.sequences()):
            tokens = sequence.output_token_ids
            if sequence.finish_reason == "stop" and not self.instance.params.include_stop_str_in_output:
                tokens = tokens[:-1]
            text = "" if tokenizer is None else tokenizer.decode(tokens, skip_special_tokens=self.skip_special_tokens)
            choices.append(CompletionOutput(i, text, tokens, sequence.cum_logprob, sequence.logprobs[:len(tokens)],
                                            sequence.finish_reason, sequence.stop_reason))
        metrics = RequestMetrics(arrival_time=self.arrival, finished_time=time.monotonic())
        return RequestOutput(self.request_id, self.prompt.get("prompt"), self.prompt["prompt_token_ids"], None,
                             choices, True, metrics)

    def close(self) -> None:
        """Nothing to release: each step's streams close when the step is collected or abandoned."""


def _empty() -> CompletionOutput:
    return CompletionOutput(0, "", [], None, None)
