"""LLMEngine: add_request / step / abort_request over the scheduler, the runner and the output processor.

    step():  [scheduler.schedule() -> runner.dispatch()]      (the next step, sent to the device at once)
             runner.fetch(oldest step in flight) -> scheduler.update() -> stop strings, logprobs, text
             -> RequestOutputs for the requests that made progress in that step

With async scheduling (the default) step() dispatches step t + 1 before it waits for step t, so the host's
scheduling and array packing overlap the device's work; step t + 1 reads step t's sampled tokens on the device.
A step that samples for a constrained request (structured outputs) is dispatched ahead too, but its sampler waits
until step t's tokens have advanced the grammars: the host then fills the token bitmask (only then is it known)
and sends the sampler, while the device runs the step's forward.
A token sampled for a request that step t stopped is dropped, so outputs are those of one step at a time. Every
mix of requests is scheduled ahead: penalties are counted on the device (the runner's LogitState).

Speculative decoding (speculative_config): proposals (n-gram ones, or a draft model's: spec_decode/draft_model.py,
run by the scheduler before it schedules the step) are made from the host's tokens, so while a running
request may speculate no step is dispatched ahead of the one in flight (async overlap resumes once none may:
requests that cannot speculate, or whose acceptance stayed low, see spec_decode/eligibility.py). A run of
verified tokens is reported token by token (stop strings end it inside the run; later tokens are dropped).

Single-threaded: callers (the offline LLM, the server's engine loop) call step() repeatedly; aborts and new
requests are applied between steps.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import logging
import numbers
import time
from collections import deque
from typing import Any, Sequence

import jax

from jaxllm import progress
from jaxllm.config import LoRAConfig, ParallelConfig, merge_token_ids
from jaxllm.errors import lone_surrogate
from jaxllm.engine import distributed
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.generation_config import sampling_defaults
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.output_processor import OUTPUT_KINDS, OutputProcessor
from jaxllm.engine.request import Request, RequestStatus
from jaxllm.engine.runner import InflightStep, ModelRunner, StepResults
from jaxllm.engine.scheduler import Scheduler, SchedulerOutput
from jaxllm.loaders import load_host_model, place_model, resolve_model
from jaxllm.lora.manager import LoRAManager
from jaxllm.lora.request import LoRARequest
from jaxllm.model import tensor_parallel
from jaxllm.model.kernels import select_kernels
from jaxllm.model.params import params_dtype
from jaxllm.model.tiled_params import tiles_wanted
from jaxllm.outputs import RequestOutput
from jaxllm.sampling_params import SamplingParams
from jaxllm.spec_decode.config import SpeculativeConfig
from jaxllm.spec_decode.draft_model import DraftProposer, check_draft, check_draft_parallel
from jaxllm.structured_outputs.compiler import GrammarCompiler
from jaxllm.structured_outputs.params import StructuredOutputsConfig
from jaxllm.structured_outputs.budget_closing import BudgetCloser
from jaxllm.structured_outputs.request_state import ReasoningGate, RequestGrammar, step_bitmask

logger = logging.getLogger(__name__)

PromptType = str | Sequence[int] | dict


class LLMEngine:
    def __init__(self, args: EngineArgs, loaded=None, tokenizer=None):
        with progress.shown(not args.disable_log_stats):
            self._start(args, loaded, tokenizer)

    def _start(self, args: EngineArgs, loaded, tokenizer) -> None:
        """Load, place, size the pool and (with warmup) compile: the part of a start that shows progress."""
        from jaxllm.tokenizer import load_tokenizer

        args.enable_compilation_cache()
        group = args.process_group()
        distributed.initialize(group)  # before JAX starts: several processes join first
        args = dataclasses.replace(args, tensor_parallel_size=distributed.tensor_parallel_size(
            args.tensor_parallel_size, group))
        self.process_index = distributed.process_index()  # 0 unless several processes run the model
        # what a request's unset sampling fields default to (vLLM's get_diff_sampling_param), read before the
        # weights so that a bad generation config fails at once
        self.sampling_defaults = sampling_defaults(args.generation_config, args.override_generation_config,
                                                   loaded.source if loaded is not None else resolve_model(args.model))
        kernels = select_kernels(args.attention, args.awq_matmul, args.lora_matmul)
        if loaded is None:  # on the host (the linears already as tiles where their kernel runs): _place puts the
            # params on their devices
            loaded = load_host_model(args.model, dtype=args.dtype, quantization=args.quantization,
                                     as_tiles=tiles_wanted(kernels, args.tensor_parallel_size or 1))
        # the params on their mesh (one device unless split) before the pool is sized
        self.parallel_config = args.parallel_config()
        self.mesh, self.loaded = _place(loaded, self.parallel_config)
        self.tokenizer = tokenizer if tokenizer is not None or args.skip_tokenizer else \
            load_tokenizer(self.loaded.source)
        self.model_config = self.loaded.config
        self.speculative_config = SpeculativeConfig.from_dict(args.speculative_config)
        draft = self._load_draft(args, kernels)  # None unless a draft model proposes; it shares the memory budget
        # every process's pool (and so the default max_model_len) must have the same shape
        self.scheduler_config, self.cache_config = args.resolve(self.loaded, distributed.agree_on_minimum, draft)
        self.eos_token_ids = self._eos_token_ids()  # every id that ends a generation
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None  # the primary one
        self.lora_config = args.lora_config()  # None unless enable_lora
        self.lora = _lora_manager(self.lora_config, self.parallel_config, self.loaded)
        self.runner = ModelRunner(self.loaded, self.cache_config, self.scheduler_config, seed=args.seed,
                                  kernels=kernels, eos_token_ids=self.eos_token_ids, mesh=self.mesh, lora=self.lora)
        self.loaded = dataclasses.replace(self.loaded, params=self.runner.params)  # tiled weights held once
        pool = BlockPool(self.cache_config.num_blocks, self.cache_config.enable_prefix_caching)
        self.drafter = self._draft_proposer(draft, args, kernels)  # None unless a draft model proposes
        self.scheduler = Scheduler(self.scheduler_config, KVCacheManager(pool, self.cache_config.block_size),
                                   self.lora, self.speculative_config, self.drafter)
        if self.lora is not None:  # the adapters of the requests in the engine stay in the host cache
            self.lora.in_use = lambda: {r.lora_int_id for r in self.scheduler.requests.values()}
        self.processor = OutputProcessor(self.tokenizer)
        self._lora_removals: set[int] = set()  # adapters retired, unregistered once no request uses them
        self.num_steps = 0
        self._rng_streams = itertools.count()
        self.async_scheduling = args.async_scheduling
        self._inflight: deque[tuple[SchedulerOutput, InflightStep]] = deque()  # dispatched, not yet fetched
        self._grammars: GrammarCompiler | None = None  # made for the first constrained request
        self.structured_outputs_config = StructuredOutputsConfig.from_dict(args.structured_outputs_config)
        if args.warmup:
            self.runner.warmup()
            if self.drafter is not None:
                self.drafter.runner.warmup()

    def _load_draft(self, args: EngineArgs, kernels):
        """The draft model (speculative_config's model) on its device, before the KV pools are sized (its
        weights and pool share the budget; its linears as tiles where their kernel runs); None unless a draft
        model proposes."""
        spec = self.speculative_config
        if spec is None or spec.method != "draft_model":
            return None
        check_draft_parallel(spec.model, self.parallel_config.num_processes)
        host = load_host_model(spec.model, dtype=args.dtype, as_tiles=tiles_wanted(kernels, 1))
        _, draft = _place(host, ParallelConfig())  # the first device
        return draft

    def _draft_proposer(self, draft, args: EngineArgs, kernels) -> DraftProposer | None:
        """The draft's proposer, the draft checked against the target (None without a draft model)."""
        if draft is None:
            return None
        spec = self.speculative_config
        check_draft(spec.model, draft.config, str(args.model), self.model_config, self.scheduler_config.max_model_len)
        draft_mesh = tensor_parallel.make_mesh(1)  # the one device _place put the draft on (the target's first)
        return DraftProposer.build(draft, self.scheduler_config, self.cache_config,
                                   seed=args.seed, kernels=kernels, mesh=draft_mesh)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None, *,
                    arrival_time: float | None = None, priority: int = 0, output_kind: str = "cumulative",
                    lora_request: LoRARequest | None = None, lora_arrays=None) -> None:
        """Queue a request; raises ValueError (naming the field) if it is invalid or could never fit.
        lora_request: the adapter to run it with (None: the prompt dict's "lora_request", else the base model);
        its files are read and checked when it is first seen, or again if it was evicted from the host cache,
        unless the caller read them already (lora_arrays: LoRAManager.read_arrays, e.g. on another thread)."""
        params = params or SamplingParams()
        if lora_request is None and isinstance(prompt, dict):
            lora_request = prompt.get("lora_request")
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
        if request_id in self.processor.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if priority != 0 and self.scheduler_config.policy != "priority":
            raise ValueError(f"priority {priority} needs priority scheduling (scheduling_policy='priority'; the "
                             f"server's --scheduling-policy priority)")
        text, token_ids = self._tokenize(prompt)
        if params.bad_words:
            params = copy.copy(params)  # the caller's params may serve engines with other tokenizers
            params.update_from_tokenizer(self.tokenizer)
        params.validate_for_vocab(self.model_config.vocab_size)
        compiled = self._compile_grammar(params)
        lora_int_id = self._register_lora(lora_request, lora_arrays)  # last: a refused request reads no adapter
        arrival = time.monotonic() if arrival_time is None else arrival_time
        num_sequences = params.num_sequences  # best_of when it exceeds n: the n best are returned
        children = [Request(request_id if num_sequences == 1 else f"{i}_{request_id}", token_ids,
                            self._child_params(params, i), arrival_time=arrival, priority=priority,
                            eos_token_ids=self.eos_token_ids, sample_index=i, ranked=params.ranks_sequences,
                            rng_stream=next(self._rng_streams), lora_int_id=lora_int_id,
                            grammar=None if compiled is None else RequestGrammar(
                                compiled, self._reasoning_gate(params.structured_outputs, token_ids),
                                self._budget_closer(params.structured_outputs)))
                    for i in range(num_sequences)]
        for child in children[1:]:
            child.wait_for = children[0]  # siblings reuse the first one's prompt blocks via the prefix cache
        added = []
        try:
            for child in children:
                self.scheduler.add_request(child)
                added.append(child)
            self.processor.add(request_id, text, children, output_kind, num_returned=params.n)
        except BaseException:  # all of the request or none of it
            for child in added:
                self.scheduler.abort(child.request_id)
            self.processor.forget(request_id)
            raise

    def _compile_grammar(self, params: SamplingParams):
        """None, or the Future of the request's compiled grammar (ValueError at once for a bad constraint)."""
        if params.structured_outputs is None:
            return None
        if self.parallel_config.num_processes > 1:
            raise ValueError("structured_outputs are not supported with several processes yet")
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        return self._grammars.submit(self.structured_outputs_config.apply(params.structured_outputs))

    def _budget_closer(self, constraint) -> BudgetCloser | None:
        """A forced tool call's closer (its JSON finished within the budget); None for other constraints."""
        if not constraint.close_within_budget or constraint.kind != "json":
            return None
        schema = constraint.json if isinstance(constraint.json, dict) else json.loads(constraint.json)
        return BudgetCloser(schema, self._grammars.token_bytes())

    def _reasoning_gate(self, constraint, prompt_ids: list[int]) -> ReasoningGate | None:
        """The gate holding a constraint back while the output reasons (None: it applies from the start). Open
        from the start when the prompt already closed the reasoning (a template that disables thinking ends the
        prompt with "<think></think>")."""
        marker = constraint.reasoning_end
        if marker is None:
            return None
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        closed = decode(prompt_ids[-ReasoningGate.WINDOW:]).rstrip().endswith(marker)
        return ReasoningGate(marker, decode, open=closed)

    # ------------------------------------------------------------------ LoRA adapters
    def add_lora(self, lora_request: LoRARequest) -> None:
        """Know an adapter before any request uses it: its files are read and checked now (ValueError naming
        the file and the problem)."""
        self._register_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        """Forget an adapter; requests already using it run to their end first (its name is free at once, its id
        is never reused)."""
        if self.lora is None:
            return
        self.lora.retire(lora_int_id)
        self._lora_removals.add(lora_int_id)
        self._drop_removed_loras()

    def list_loras(self) -> list[LoRARequest]:
        if self.lora is None:
            return []
        return [r for i, r in self.lora.registered.items() if i not in self.lora.retired]

    def _register_lora(self, lora_request: LoRARequest | None, arrays=None) -> int:
        """The adapter's id (0 for none), registering it with the manager (which then holds its arrays)."""
        if lora_request is None:
            return 0
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        if self.lora is None:
            raise ValueError(f"lora_request {lora_request.lora_name!r} given, but LoRA is not enabled "
                             "(enable_lora=True)")
        self.lora.register(lora_request, arrays)
        return lora_request.lora_int_id

    def _drop_removed_loras(self) -> None:
        """Unregister the removed adapters that no request uses any more."""
        in_use = {r.lora_int_id for r in self.scheduler.requests.values()}
        for lora_int_id in [i for i in self._lora_removals if i not in in_use]:
            self.lora.unregister(lora_int_id)
            self._lora_removals.discard(lora_int_id)

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            for child in self.processor.abort(request_id):
                self.scheduler.finish(child, RequestStatus.FINISHED_ABORTED)
            self.processor.forget(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.processor.parents)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        self._dispatch()
        failed = self._grammar_failures()
        if not self._inflight:
            if self.scheduler.has_unfinished_requests() and not failed:
                if any(r.grammar is not None and not r.grammar.ready for r in self.scheduler.waiting):
                    time.sleep(0.001)  # grammars still compiling, nothing else to run
                    return []
                raise RuntimeError("the scheduler could not schedule any request although some are unfinished")
            return failed
        if self._inflight[0][1].awaits_bitmask:  # the oldest step: every earlier token has reached the grammars
            self._sample_constrained(*self._inflight[0])
            self._dispatch()  # the next step can go ahead now
        out, inflight = self._inflight.popleft()
        outputs = self._process(out, self.runner.fetch(inflight))
        if self._lora_removals:
            self._drop_removed_loras()
        return failed + outputs

    def _dispatch(self) -> None:
        """Send steps to the device: one when none is in flight, and one more ahead under async scheduling (not
        past a step whose sampler waits for its bitmask: the next forward reads that step's tokens)."""
        depth = 2 if self.async_scheduling else 1
        while len(self._inflight) < depth and not (self._inflight and (self._inflight[-1][1].awaits_bitmask or
                                                                      self._holds_back_for_proposals())):
            out = self.scheduler.schedule()
            if not out.chunks:
                self.runner.forget(out.finished_request_ids)
                return
            now = time.monotonic()
            constrained = False
            for chunk, request in zip(out.chunks, self.scheduler.scheduled_requests(out)):
                if chunk.new is not None:  # the first time it runs, or again after preemption
                    self.processor.mark_scheduled(request, now)
                constrained |= chunk.samples and request.grammar is not None
            self._inflight.append((out, self.runner.dispatch(out, defer_sample=constrained)))

    def _holds_back_for_proposals(self) -> bool:
        """With a step in flight: whether the next one must wait for its tokens (proposals are made from them, and
        a step with proposals changes its requests' computed-token counts when it is verified)."""
        if self.speculative_config is None:
            return False
        return bool(self._inflight[-1][0].scheduled_spec_decode_tokens) or self.scheduler.speculating()

    def _sample_constrained(self, out: SchedulerOutput, inflight: InflightStep) -> None:
        """Fill the step's token bitmask from its requests' grammars and send its sampler."""
        sampled = [r for c, r in zip(out.chunks, self.scheduler.scheduled_requests(out)) if c.samples]
        proposals = [list(out.scheduled_spec_decode_tokens.get(r.request_id, ())) for r in sampled]
        grammars = [None if r.status.finished else r.grammar for r in sampled]
        budgets = [r.length_limit - r.num_tokens for r in sampled]  # this step's token included
        self.runner.sample(inflight, step_bitmask(grammars, proposals, self.runner.bitmask_width, budgets))

    def _grammar_failures(self) -> list[RequestOutput]:
        """Outputs (finish_reason "abort") of requests whose grammar could not be compiled."""
        failed, self.scheduler.failed = self.scheduler.failed, []
        for request in failed:
            logger.error("request %s: its grammar could not be compiled: %s", request.request_id,
                         request.grammar.error)
        return self.processor.outputs_for(failed)

    def _process(self, out: SchedulerOutput, results: StepResults) -> list[RequestOutput]:
        requests = self.scheduler.scheduled_requests(out)
        ended_before = [r.status.finished for r in requests]  # e.g. aborted while the step ran
        runs = results.spec_tokens
        num_before = {r.request_id: len(r.output_token_ids) for r in requests if r.request_id in runs} if runs \
            else {}
        self.scheduler.update(out, results.tokens, runs)
        self.num_steps += 1
        progressed = []
        for request, ended in zip(requests, ended_before):
            if ended:
                continue  # its token from this step is dropped
            request_id = request.request_id
            if request_id in results.prompt_logprobs:
                self.processor.record_prompt_logprobs(request, results.prompt_logprobs[request_id])
            if request_id in num_before:
                self._record_run(request, num_before[request_id], results.spec_logprobs.get(request_id))
                progressed.append(request)
                continue
            token_id = results.tokens.get(request_id)
            if token_id is None:
                continue
            stop = self.processor.record_sample(request, token_id, results.logprobs.get(request_id))
            if stop is not None and request.status.finished:  # the same token also hit a length limit
                request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            elif stop is not None:
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED, stop)
            progressed.append(request)
        return self.processor.outputs_for(progressed)

    def _record_run(self, request: Request, num_before: int, logprobs) -> None:
        """Report the tokens update() appended from a verified run, one by one; a stop string inside the run
        ends the request there (the tokens after it are dropped)."""
        new = request.output_token_ids[num_before:]
        for j, token_id in enumerate(new):
            last = j == len(new) - 1
            stop = self.processor.record_sample(request, token_id, None if logprobs is None else logprobs[j],
                                                last=last)
            if stop is None:
                continue
            request.truncate_output(num_before + j + 1)
            if request.status.finished:
                request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            else:
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED, stop)
            return

    # ------------------------------------------------------------------ helpers
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(the prompt's text if known, its token ids), checked as add_request checks them (ValueError)."""
        return self._tokenize(prompt)

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            _check_prompt_keys(prompt)
            if "prompt_token_ids" in prompt:
                text, token_ids = prompt.get("prompt"), _token_list(prompt["prompt_token_ids"],
                                                                    "prompt_token_ids must be a list of token ids")
            elif "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        elif isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; pass prompt_token_ids instead")
            if (position := lone_surrogate(prompt)) is not None:
                raise ValueError(f"prompt holds {prompt[position]!r} at position {position}, a lone UTF-16 "
                                 f"surrogate: not valid Unicode")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, _token_list(prompt, "prompt must be text, a list of token ids or a prompt dict")
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        vocab = self.model_config.vocab_size
        for i, token in enumerate(token_ids):
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise ValueError(f"prompt_token_ids[{i}] = {token!r} is not a token id: must be an int, got "
                                 f"{type(token).__name__}")
            if not 0 <= token < vocab:
                raise ValueError(f"prompt_token_ids[{i}] = {token!r} is not a token id in [0, {vocab}) (out of "
                                 f"vocabulary)")
        return text, [int(token) for token in token_ids]  # numpy's integers as ints

    @staticmethod
    def _child_params(params: SamplingParams, index: int) -> SamplingParams:
        """One sequence's params: a single sample, seeded seed + index when the request is seeded."""
        if params.num_sequences == 1:
            return params
        seed = None if params.seed is None else params.seed + index
        child = copy.copy(params)  # keeps what the engine derived (bad_words' token ids)
        child.n, child.best_of, child.seed = 1, None, seed
        return child

    def _eos_token_ids(self) -> tuple[int, ...]:
        """The tokenizer's EOS id first (the primary one), then every EOS id the model's config lists."""
        primary = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        return merge_token_ids(primary, self.model_config.eos_token_ids)

    def stats(self) -> dict[str, Any]:
        pool = self.scheduler.kv_cache.pool
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_waiting_for_lora": min(self.scheduler.num_waiting_for_lora, len(self.scheduler.waiting)),
            "num_preemptions": self.scheduler.num_preemptions,
            "num_prompt_tokens_computed": self.scheduler.num_prompt_tokens_computed,
            "kv_cache_usage": pool.usage(),
            "prefix_cache_queries": pool.prefix_cache_queries,
            "prefix_cache_hits": pool.prefix_cache_hits,
            "num_compiled_programs": self.runner.num_compiled_programs,
            "compile_seconds": self.runner.programs.compile_seconds,
            "num_steps": self.num_steps,
            # Blocks with no request holding them (ref count 0), including those that still hold a cached prefix
            # and are evicted when allocation reuses them; out of num_total_blocks, the pool less the null block.
            "num_free_blocks": pool.num_free_blocks,
            "num_total_blocks": pool.num_usable_blocks,
            **(self.scheduler.spec_stats.as_stats() if self.scheduler.spec_stats is not None else {}),
        }


def _lora_manager(lora: LoRAConfig | None, parallel: ParallelConfig, loaded) -> LoRAManager | None:
    if lora is None:
        return None
    if parallel.num_processes > 1:
        raise ValueError("enable_lora is not supported with several processes yet")
    if loaded.config.num_experts:
        raise ValueError(f"enable_lora is not supported for mixture-of-experts models ({loaded.config.architecture}): "
                         "LoRA on expert weights is not implemented")
    return LoRAManager(loaded.config, **dataclasses.asdict(lora), dtype=params_dtype(loaded.params))


def _place(loaded, parallel: ParallelConfig):
    """(the mesh of tensor_parallel_size devices, `loaded` with its params on it); ValueError for sizes that
    cannot work, and for expert parallelism asked of a dense model.

    Split over several devices, each receives only its own part, from the host (params already on a device are
    fetched first): no device holds the whole model on the way."""
    tp_size = parallel.tensor_parallel_size
    if parallel.enable_expert_parallel:
        if not loaded.config.num_experts:
            raise ValueError(f"enable_expert_parallel needs a mixture-of-experts model; this "
                             f"{loaded.config.architecture} model has no experts")
        loaded = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, expert_parallel=True))
    tensor_parallel.check_tp_size(loaded.config, tp_size, len(jax.devices()))
    mesh = tensor_parallel.make_mesh(tp_size)
    return mesh, place_model(loaded, mesh)


def _token_list(token_ids, requirement: str) -> list:
    """A prompt's token ids as a list; ValueError (the requirement, and the type given) for what holds none (an
    int, None)."""
    try:
        return list(token_ids)
    except TypeError:
        raise ValueError(f"{requirement}, got {type(token_ids).__name__}") from None


PROMPT_KEYS = ("prompt", "prompt_token_ids", "lora_request")  # what a prompt dict may hold


def _check_prompt_keys(prompt: dict) -> None:
    for key in prompt:
        if key not in PROMPT_KEYS:
            hint = "; for an adapter per prompt use LLM.generate_with_lora" if key == "lora" else ""
            raise ValueError(f"prompt dict key {key!r} is not supported (a prompt dict takes {', '.join(PROMPT_KEYS)})"
                             f"{hint}")
