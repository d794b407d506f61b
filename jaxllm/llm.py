"""The offline API, as vLLM users know it: LLM(model).generate(prompts, SamplingParams(...))."""

from __future__ import annotations

import itertools
from typing import Sequence

from jaxllm import beam_search_steps
from jaxllm.beam_search import BeamSearchOutput, BeamSearchParams
from jaxllm.chat_renderer import ChatRenderer
from jaxllm.chat_templates import load_chat_template, template_kwargs
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine, PromptType
from jaxllm.lora.request import LoRARequest
from jaxllm.outputs import RequestOutput
from jaxllm.sampling_params import SamplingParams


class LLM:
    """Load a model once, then generate for batches of prompts with continuous batching.

    Arguments are EngineArgs fields (jaxllm.engine.args.EngineArgs: model, None for the default model, dtype,
    max_model_len, max_num_seqs, generation_config, ...; `jaxllm serve --help` lists them all as flags).
    """

    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self._ids = itertools.count()
        self._renderer: ChatRenderer | None = None  # started at the first chat

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The SamplingParams that generate and chat use when given none: the generation config's values
        (generation_config, override_generation_config), SamplingParams' own defaults for the rest."""
        return SamplingParams(**self.engine.sampling_defaults)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of `prompts`. A prompt is a string, a list of token ids, or a dict with
        "prompt" or "prompt_token_ids" (and optionally its own "lora_request"); sampling_params is one for all
        prompts or one per prompt (None: get_default_sampling_params()). lora_request (LLM(..., enable_lora=True)):
        one adapter for all prompts, or one per prompt (None: the base model). Each output holds n completions
        (with best_of > n: the n of highest cumulative logprob, best first)."""
        prompts = self._as_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = self._params_per_prompt(sampling_params, len(prompts))
        loras = self._loras_per_prompt(lora_request, prompts)
        priority = list(priority) if priority is not None else [0] * len(prompts)
        if len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p, prio, lora in zip(prompts, params, priority, loras):
                ids.append(str(next(self._ids)))
                self.engine.add_request(ids[-1], prompt, p, priority=prio, output_kind="final", lora_request=lora)
        except ValueError:
            self.engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def generate_with_lora(self, requests: Sequence[dict], sampling_params: SamplingParams | Sequence[SamplingParams]
                           | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """generate for [{"prompt": text, token ids or a prompt dict, "lora": LoRARequest | None}, ...]: each
        prompt with its own adapter (None: the base model). A front over generate's per-prompt lora_request."""
        for i, request in enumerate(requests):
            if not isinstance(request, dict) or "prompt" not in request:
                raise ValueError(f"requests[{i}] must be a dict with 'prompt' (and optionally 'lora')")
            for key in request:
                if key not in ("prompt", "lora"):
                    raise ValueError(f"requests[{i}] key {key!r} is not supported: a request takes 'prompt', 'lora'")
        return self.generate([r["prompt"] for r in requests], sampling_params, use_tqdm=use_tqdm,
                             lora_request=[r.get("lora") for r in requests])

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """The beam_width best hypotheses of each prompt (a string, token ids or a prompt dict, as generate),
        best first, in the order of `prompts`; the search is Hugging Face's generate(num_beams=beam_width,
        length_penalty, early_stopping) (jaxllm/beam_search.py says where vLLM's differs). Every step runs the
        running beams of all prompts together, one engine request each, sharing blocks through the prefix
        cache."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        prompts = self._as_list(prompts)
        loras = self._loras_per_prompt(lora_request, prompts)
        eos = () if params.ignore_eos else self.engine.eos_token_ids
        step_params = beam_search_steps.step_sampling_params(params, eos)
        max_len = self.engine.scheduler_config.max_model_len
        instances = [beam_search_steps.new_instance(self.engine.tokenize(p)[1], params, eos, max_len, lora)
                     for p, lora in zip(prompts, loras)]
        while batch := beam_search_steps.step_prompts(instances):
            outputs = self.generate([{"prompt_token_ids": tokens} for _, tokens in batch], step_params,
                                    use_tqdm=use_tqdm, lora_request=[inst.lora_request for inst, _ in batch])
            beam_search_steps.advance_all(batch, outputs)
        tokenizer = self.get_tokenizer()
        return [BeamSearchOutput(beam_search_steps.decode_sequences(inst, tokenizer)) for inst in instances]

    def chat(
        self,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or to a list of them;
        lora_request as in generate. chat_template: a template (its text, or a file) instead of the model's;
        tools: OpenAI tool definitions the template lays out; chat_template_kwargs: values of the template's
        variables (e.g. enable_thinking); add_generation_prompt / continue_final_message as vLLM's."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if self._renderer is None:
            self._renderer = ChatRenderer(self.get_tokenizer())  # the template runs under a time and memory bound
        options = dict(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                       chat_template=None if chat_template is None else load_chat_template(chat_template),
                       tools=tools, template_kwargs=template_kwargs(chat_template_kwargs))
        prompts = [{"prompt_token_ids": self._renderer.prompt_ids(c, **options)} for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = _progress_bar(len(ids)) if use_tqdm and self.engine.process_index == 0 else None  # one bar
        generated = 0
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        generated += sum(len(o.token_ids) for o in output.outputs)
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix_str(f"{generated / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s")
        except BaseException:
            self.engine.abort_request([i for i in ids if i not in finished])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [finished[i] for i in ids]

    @staticmethod
    def _as_list(prompts) -> list:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # one prompt given as token ids
        return prompts

    @staticmethod
    def _loras_per_prompt(lora_request, prompts: list) -> list[LoRARequest | None]:
        """One adapter (or None) per prompt: a prompt dict's own "lora_request" wins over the argument."""
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise ValueError(f"got {len(loras)} lora_request entries for {len(prompts)} prompts")
        return [p.get("lora_request", lora) if isinstance(p, dict) else lora for p, lora in zip(prompts, loras)]

    @staticmethod
    def _params_per_prompt(sampling_params, count: int) -> list[SamplingParams]:
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        sampling_params = list(sampling_params)
        if len(sampling_params) != count:
            raise ValueError(f"got {len(sampling_params)} sampling_params for {count} prompts")
        return sampling_params


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
