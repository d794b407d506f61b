"""ModelRunner: the only owner of device state (params, KV pool) and of the jitted step.

    execute(SchedulerOutput):
        bucket the step's shape -> StepBatch + SamplingBatch (numpy, padded)
        -> step(params, kv, batch, sampling, rows) = forward + sample + prompt logprobs, ONE program, kv donated
        -> one device-to-host copy of the results

Logits rows: each sampling chunk contributes its last token's row; chunks of requests that asked for
prompt_logprobs contribute a row per prompt position too. `sample_rows [S]` and `prompt_rows [PR]` pick them.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxllm.config import CacheConfig, SchedulerConfig
from jaxllm.engine.bucketing import Buckets, StepShape, pow2_at_least
from jaxllm.engine.output_processor import SampleResult
from jaxllm.engine.scheduler import ScheduledChunk, SchedulerOutput
from jaxllm.model import SequenceChunk, build_step_batch, forward, init_kv_cache
from jaxllm.model.params import params_dtype
from jaxllm.outputs import Logprob, PromptLogprobs
from jaxllm.sampler import sample
from jaxllm.sampling_batch import SamplingRow, build_sampling_batch
from jaxllm.sampling_params import MAX_LOGPROBS, SamplingParams

logger = logging.getLogger(__name__)


@struct.dataclass
class PromptRows:
    rows: jax.Array  # [PR] logits rows of prompt positions
    targets: jax.Array  # [PR] the prompt token each row predicts
    top_n: int = struct.field(pytree_node=False)  # top logprobs to return per row


def _step(params, kv, batch, sampling, sample_rows, prompt, *, config, attention):
    logits, kv = forward(params, kv, batch, config=config, attention=attention)  # [R, V] float32
    sampled = sample(logits[sample_rows], sampling)
    prompt_out = None
    if prompt is not None:
        prompt_out = _prompt_logprobs(logits[prompt.rows], prompt.targets, prompt.top_n)
    return sampled, prompt_out, kv


def _prompt_logprobs(logits, targets, top_n: int):
    """logits [PR, V], targets [PR] -> (target logprob [PR], target rank [PR], top ids [PR, N], top lps [PR, N])."""
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    target = jnp.take_along_axis(logprobs, targets[:, None], axis=-1)[:, 0]
    rank = 1 + jnp.sum(logprobs > target[:, None], axis=-1)
    top_lp, top_ids = jax.lax.top_k(logprobs, top_n)
    return target, rank, top_ids, top_lp


class ModelRunner:
    def __init__(self, loaded, cache: CacheConfig, scheduler: SchedulerConfig, *, seed: int = 0,
                 attention: str = "auto", eos_token_ids: tuple[int, ...] = ()):
        self.config = loaded.config
        self.params = loaded.params
        self.block_size = cache.block_size
        self.seed = seed
        self.eos_token_ids = eos_token_ids
        self.kv = init_kv_cache(self.config, cache.num_blocks, cache.block_size, params_dtype(self.params))
        self.buckets = Buckets(scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                               -(-scheduler.max_model_len // cache.block_size))
        self._step = jax.jit(functools.partial(_step, config=self.config, attention=attention),
                             donate_argnums=(1,))
        self.step_shapes: set[StepShape] = set()  # step shapes run so far
        self._programs_logged = 0

    @property
    def num_compiled_programs(self) -> int:
        """Programs XLA compiled for the step (shape x sampling variants)."""
        return self._step._cache_size()

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, SampleResult], dict[str, PromptLogprobs]]:
        chunks = out.chunks
        shape = self.buckets.shape_for([c.num_new_tokens for c in chunks], [len(c.block_ids) for c in chunks])
        self.step_shapes.add(shape)
        sampling_chunks = [c for c in chunks if c.samples]
        prompt_spans = [self._prompt_span(c) for c in chunks]  # prompt positions needing logprobs, per chunk
        seq_chunks, sample_rows, prompt_rows, targets = self._logit_rows(chunks, prompt_spans)
        num_prompt_rows = pow2_at_least(len(prompt_rows)) if prompt_rows else 0
        batch = build_step_batch(seq_chunks, self.block_size, num_tokens=shape.num_tokens,
                                 num_seqs=shape.num_seqs, max_blocks=shape.max_blocks,
                                 max_query_len=shape.max_query_len, num_logits=shape.num_seqs + num_prompt_rows,
                                 num_prefill_rows=shape.num_prefill_rows)
        sampling = build_sampling_batch(
            [SamplingRow(c.request.sampling_params, c.request.prompt_token_ids, c.request.output_token_ids,
                         c.request.rng_stream) for c in sampling_chunks],
            shape.num_seqs, self.config.vocab_size, base_seed=self.seed, eos_token_ids=self.eos_token_ids)
        prompt = None
        if prompt_rows:
            top_n = max(max(c.request.sampling_params.prompt_logprobs for c, span in zip(chunks, prompt_spans)
                            if span), 1)
            prompt = PromptRows(_pad(prompt_rows, num_prompt_rows), _pad(targets, num_prompt_rows),
                                top_n=min(pow2_at_least(top_n), MAX_LOGPROBS))
        sampled, prompt_out, self.kv = self._step(self.params, self.kv, batch, sampling,
                                                  _pad(sample_rows, shape.num_seqs), prompt)
        sampled, prompt_out = jax.device_get((sampled, prompt_out))  # the step's one device-to-host copy
        if self.num_compiled_programs > self._programs_logged:
            self._programs_logged = self.num_compiled_programs
            logger.info("compiled step program %d for shape %s", self._programs_logged, shape)
        results = {c.request.request_id: _sample_result(sampled, i, c.request.sampling_params.logprobs)
                   for i, c in enumerate(sampling_chunks)}
        return results, self._split_prompt_logprobs(chunks, prompt_spans, prompt_out)

    def _prompt_span(self, chunk: ScheduledChunk) -> range:
        """Positions p of this chunk whose logits score prompt token p + 1 (for prompt_logprobs requests)."""
        request = chunk.request
        if request.sampling_params.prompt_logprobs is None or request.num_preemptions or request.sample_index:
            return range(0)  # reported once: by the first sample, before any preemption
        end = chunk.num_computed_before + chunk.num_new_tokens
        return range(chunk.num_computed_before, min(end, request.num_prompt_tokens - 1))

    @staticmethod
    def _logit_rows(chunks, prompt_spans):
        """SequenceChunks asking for the right logits, and where each sampling / prompt row lands."""
        seq_chunks, sample_rows, prompt_rows, targets = [], [], [], []
        row = 0
        for chunk, span in zip(chunks, prompt_spans):
            offsets = [p - chunk.num_computed_before for p in span]
            if chunk.samples:
                offsets.append(chunk.num_new_tokens - 1)
            seq_chunks.append(SequenceChunk(chunk.token_ids, chunk.num_computed_before, chunk.block_ids,
                                            want_logits=offsets))
            prompt_rows += range(row, row + len(span))
            targets += [chunk.request.prompt_token_ids[p + 1] for p in span]
            row += len(offsets)
            if chunk.samples:
                sample_rows.append(row - 1)
        return seq_chunks, sample_rows, prompt_rows, targets

    def _split_prompt_logprobs(self, chunks, spans, prompt_out) -> dict[str, PromptLogprobs]:
        if prompt_out is None:
            return {}
        target, rank, top_ids, top_lp = prompt_out
        result: dict[str, PromptLogprobs] = {}
        i = 0
        for chunk, span in zip(chunks, spans):
            if not span:
                continue
            n = chunk.request.sampling_params.prompt_logprobs
            entries = []
            for j in range(i, i + len(span)):
                entry = {int(t): Logprob(float(lp), rank=k + 1) for k, (t, lp) in enumerate(zip(top_ids[j][:n],
                                                                                                  top_lp[j][:n]))}
                token = chunk.request.prompt_token_ids[span[j - i] + 1]
                entry.setdefault(token, Logprob(float(target[j]), rank=int(rank[j])))
                entries.append(entry)
            result[chunk.request.request_id] = entries
            i += len(span)
        return result

    def warmup(self) -> None:
        """Compile the decode programs of every (S, MB) bucket (greedy sampling) before serving."""
        greedy = SamplingParams(temperature=0.0)
        for shape in self.buckets.decode_shapes():
            chunks = [SequenceChunk([0], 0, [0] * shape.max_blocks) for _ in range(shape.num_seqs)]
            batch = build_step_batch(chunks, self.block_size, max_blocks=shape.max_blocks)
            sampling = build_sampling_batch([SamplingRow(greedy, [0], [])] * shape.num_seqs, shape.num_seqs,
                                            self.config.vocab_size)
            _, _, self.kv = self._step(self.params, self.kv, batch, sampling,
                                       np.arange(shape.num_seqs, dtype=np.int32), None)
        jax.block_until_ready(self.kv)
        logger.info("warm-up compiled %d decode programs", len(self.buckets.decode_shapes()))


def _pad(values, size: int) -> np.ndarray:
    out = np.zeros(size, np.int32)
    out[:len(values)] = values
    return out


def _sample_result(sampled, row: int, num_logprobs: int | None) -> SampleResult:
    token = int(sampled.sampled_token_ids[row])
    if num_logprobs is None:
        return SampleResult(token, 0.0, 0, [])
    top = [(int(t), float(lp)) for t, lp in zip(sampled.top_logprob_token_ids[row][:num_logprobs],
                                                  sampled.top_logprobs[row][:num_logprobs])]
    return SampleResult(token, float(sampled.sampled_logprobs[row]), int(sampled.sampled_ranks[row]), top)
