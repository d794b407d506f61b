"""The engine's jitted programs, compiled ahead of time per bucket (engine/bucketing.py) and kept by key.

    forward(params, kv, batch, prev_tokens, prev_rows, lora) -> (hidden [R, H], kv)    kv donated
        batch.token_ids [T], with the previous step's sampled tokens swapped in where prev_rows [T] >= 0: under
        async scheduling a token sampled by step t is fed to step t + 1 without visiting the host.
        lora: None, or the adapters' device slots (lora/device_slots.py): each linear then adds the delta of
        the adapter in its token's slot, batch.lora_slots [T] (model/lora_weight.py). Which adapters a step
        mixes is data: the program is the same.
    sample(params, hidden, sampling, state) -> (SamplerOutput [S], next_tokens [S_max], state)    state donated
        logits [S, V] = LM head of hidden[:S], on the device only; next_tokens is the prev_tokens of the next step.
        sampling.token_bitmask [S, ceil(V / 32)]: the tokens each row may take (structured outputs; all bits set
        in plain rows), so one program serves every mix of constrained and plain rows.
        state: the LogitState of the runner's slots (sampling_batch.py), read for the rows' adjustments; each
        sampled token is counted into its row's slot.
    write_logit_rows(state, slot, rows) -> state    state donated
        A request's LogitState rows ([V] each) written into its slot, once, when the runner takes it on.
    prompt_logprobs(params, hidden, first_row, targets [P]) -> (logprob [P], rank [P], top ids [P, N], top lps [P, N])
        P = PROMPT_ROWS rows of hidden from first_row; N = MAX_LOGPROBS.

StepPrograms.run(key, *args) runs the program a ProgramKey names (its kind: one of the signatures above; the key is
the compiled program's cache key). `compile_all` builds every program of the bucket set (warm-up); a program not
built yet is built on first use and logged. Nothing else ever reaches XLA: the runner calls run only.
`program(key)` is the jitted function with its static arguments, for lowering a program elsewhere (tests).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxllm import progress
from jaxllm.compile_counter import BACKEND_COMPILE_EVENT
from jaxllm.config import ModelConfig
from jaxllm.engine import compilation_cache, program_cache
from jaxllm.engine.bucketing import PROMPT_ROWS, Buckets, ProgramKey
from jaxllm.model import StepBatch, compute_logits, forward_hidden, lora_weight
from jaxllm.model.kernels import REFERENCE, Kernels
from jaxllm.model.tensor_parallel import default_mesh, lm_head_kernels
from jaxllm.model.params import params_dtype
from jaxllm.sampler import count_sampled, sample, token_logprobs
from jaxllm.sampling_batch import LogitState, SamplingBatch, bitmask_width, logit_row_shapes, logit_state_shapes, \
    pack_sampling_batch
from jaxllm.sampling_params import MAX_LOGPROBS

logger = logging.getLogger(__name__)

PROMPT_LOGPROBS_KEY = ProgramKey("prompt_logprobs")
_NOT_TRIED = object()  # StepPrograms._compile: the disk was not looked at yet
WRITE_LOGIT_ROWS_KEY = ProgramKey("write_logit_rows")


def _forward(params, kv, batch: StepBatch, prev_tokens, prev_rows, lora, *, config, kernels: Kernels, mesh):
    tokens = jnp.where(prev_rows >= 0, prev_tokens[jnp.maximum(prev_rows, 0)], batch.token_ids)  # [T]
    batch = batch.replace(token_ids=tokens)
    if lora is not None:
        params = lora_weight.attach(params, lora, batch.lora_slots)
    return forward_hidden(params, kv, batch, config=config, kernels=kernels, mesh=mesh)


def _logits(params, hidden, vocab_size: int, replicated: NamedSharding, softcap: float | None,
            kernels: Kernels) -> jax.Array:
    """[R, V] float32 (soft-capped where the model caps its logits: Gemma 2). Over several devices the LM head is split over the vocabulary: gather the logits once here,
    or XLA partitions the sampler's vocabulary reductions into many small collectives (some in every top-p
    pass)."""
    return jax.lax.with_sharding_constraint(compute_logits(params, hidden, vocab_size, softcap, kernels), replicated)


def _sample(params, hidden, sampling: SamplingBatch, state: LogitState, *, num_rows: int, num_sample_rows: int,
            vocab_size: int, replicated: NamedSharding, softcap: float | None = None, kernels: Kernels = REFERENCE):
    sampling = sampling.replace(state=state)
    out = sample(_logits(params, hidden[:num_rows], vocab_size, replicated, softcap, kernels), sampling,
                 kernels)  # logits [S, V]
    next_tokens = jnp.pad(out.sampled_token_ids, (0, num_sample_rows - num_rows))
    return out, next_tokens, count_sampled(state, sampling, out.sampled_token_ids)


def _write_logit_rows(state: LogitState, slot, rows: LogitState) -> LogitState:
    return jax.tree.map(lambda table, row: table.at[slot].set(row), state, rows)


def _prompt_logprobs(params, hidden, first_row, targets, *, vocab_size: int, replicated: NamedSharding,
                     softcap: float | None = None, kernels: Kernels = REFERENCE):
    rows = jax.lax.dynamic_slice_in_dim(hidden, first_row, targets.shape[0])  # [P, H]
    logprobs = jax.nn.log_softmax(_logits(params, rows, vocab_size, replicated, softcap, kernels), axis=-1)  # [P, V]
    return token_logprobs(logprobs, targets, min(MAX_LOGPROBS, logprobs.shape[1]))


@dataclasses.dataclass(frozen=True)
class Program:
    """A jitted program and the static arguments its key fixes."""
    jitted: Callable
    static: dict

    def lower(self, *args):
        return self.jitted.lower(*args, **self.static)


class StepPrograms:
    """`mesh`: the device mesh the params and the pool lie on (tensor_parallel.py: one device unless the model is
    split; None: default_mesh()); the programs' other inputs are replicated over it."""

    def __init__(self, config: ModelConfig, kernels: Kernels, buckets: Buckets, max_blocks_per_seq: int,
                 mesh: Mesh | None = None, lora_slots=None):
        """lora_slots: None, or the adapters' device slots (their shapes are the programs' lora argument)."""
        self.config = config
        self.lora_slots = lora_slots
        self.buckets = buckets
        self.max_blocks_per_seq = max_blocks_per_seq
        mesh = mesh or default_mesh()
        # what the functions close over, part of each program's identity (a Mesh's repr names no devices)
        self._closure = (config, kernels, mesh, [(d.id, d.platform, d.device_kind) for d in mesh.devices.flat])
        self._devices = list(mesh.devices.flat)  # where a program loaded from the disk runs
        self._replicated = NamedSharding(mesh, PartitionSpec())
        vocab = config.vocab_size
        head_kernels = lm_head_kernels(kernels, mesh)
        self._jitted = {
            "forward": jax.jit(functools.partial(_forward, config=config, kernels=kernels, mesh=mesh),
                               donate_argnums=(1,)),
            "sample": jax.jit(functools.partial(_sample, vocab_size=vocab, replicated=self._replicated,
                                                softcap=config.final_logit_softcap, kernels=head_kernels),
                              static_argnames=("num_rows", "num_sample_rows"), donate_argnums=(3,)),
            "write_logit_rows": jax.jit(_write_logit_rows, donate_argnums=(0,)),
            "prompt_logprobs": jax.jit(functools.partial(_prompt_logprobs, vocab_size=vocab,
                                                         replicated=self._replicated,
                                                         softcap=config.final_logit_softcap,
                                                         kernels=head_kernels)),
        }
        self.compiled: dict[ProgramKey, Any] = {}
        self.compile_seconds = 0.0
        self.used: set[ProgramKey] = set()  # by steps so far

    def program(self, key: ProgramKey) -> Program:
        if key.kind == "sample":
            return Program(self._jitted["sample"], {"num_rows": key.size,
                                                    "num_sample_rows": self.buckets.num_sample_rows})
        return Program(self._jitted[key.kind], {})

    def run(self, key: ProgramKey, *args):
        """The program of `key` on args (built first if it is not yet)."""
        self.used.add(key)
        program = self.compiled.get(key)
        if program is None:
            program = self._compile(key, jax.tree.map(self._placed, args))
        return program(*args)

    def compile_all(self, params, kv) -> None:
        """Build every program of the bucket set (the warm-up): afterwards no step compiles anything. Programs
        kept on the disk load on several threads at once; the others compile one after the other."""
        missing = [key for key in self.buckets.all_programs() if key not in self.compiled]
        args = {key: self.example_args(key, params, kv) for key in missing}
        keys = {key: self._disk_key(key, args[key]) for key in missing}
        directory = compilation_cache.directory_in_use()
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            loading = {key: pool.submit(program_cache.load, directory, keys[key], self._devices) for key in missing}
            for key in progress.track(missing, "Compiling", "programs", total=len(missing)):  # logs count and time
                self._compile(key, args[key], loading[key].result(), keys[key])

    def _disk_key(self, key: ProgramKey, args) -> str:
        """The program's key in program_cache: its identity (its key, static arguments and closure) and args."""
        identity = (key, sorted(self.program(key).static.items()), *self._closure)
        return program_cache.program_key(identity, args)

    def _compile(self, key: ProgramKey, args, loaded=_NOT_TRIED, disk_key: str | None = None):
        """The program of `key` for args: `loaded` from the disk (None: it was not there), else loaded now
        (program_cache), else compiled (and kept there)."""
        start = time.perf_counter()
        directory = compilation_cache.directory_in_use()
        disk_key = disk_key or self._disk_key(key, args)
        compiled = program_cache.load(directory, disk_key, self._devices) if loaded is _NOT_TRIED else loaded
        from_disk = compiled is not None
        if compiled is None:
            compiled = program_cache.compile_and_store(directory, disk_key,
                                                       lambda: self.program(key).lower(*args).compile())
        seconds = time.perf_counter() - start
        if from_disk:  # counted as JAX counts a program its own cache serves (compile_counter.py)
            jax.monitoring.record_event_duration_secs(BACKEND_COMPILE_EVENT, seconds, fun_name=key.kind)
        self.compiled[key] = compiled
        self.compile_seconds += seconds
        logger.info("built program %d (%s) in %.2f s%s", len(self.compiled), key, seconds,
                    " (from the disk)" if from_disk else "")
        return compiled

    def example_args(self, key: ProgramKey, params, kv) -> tuple:
        """Arguments of the program's shapes (abstract where they are not the params or the pool; replicated over
        the mesh)."""
        return jax.tree.map(self._placed, self._example_args(key, params, kv))

    def _placed(self, leaf):
        """A host array or abstract value as the program's input: replicated over the mesh (device arrays keep
        their own placement)."""
        if not isinstance(leaf, (jax.ShapeDtypeStruct, np.ndarray, np.generic)):
            return leaf
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None:
            return leaf  # placed already (the LoRA slots, split like their base weights)
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=self._replicated)

    def _example_args(self, key: ProgramKey, params, kv) -> tuple:
        vocab = self.config.vocab_size
        if key == WRITE_LOGIT_ROWS_KEY:
            return self.abstract_logit_state(), _abstract((), jnp.int32), logit_row_shapes(vocab)
        hidden = _abstract((self.buckets.num_logits_rows, self.config.hidden_size), params_dtype(params))
        if key.kind == "forward":
            num_tokens = key.size
            return (params, kv, self.abstract_step_batch(num_tokens, key.decode_only),
                    _abstract((self.buckets.num_sample_rows,), jnp.int32), _abstract((num_tokens,), jnp.int32),
                    self.lora_slots)
        if key.kind == "sample":
            return (params, hidden, abstract_sampling_batch(key.size, self.config.vocab_size),
                    self.abstract_logit_state())
        return params, hidden, _abstract((), jnp.int32), _abstract((PROMPT_ROWS,), jnp.int32)

    def abstract_logit_state(self) -> LogitState:
        """The runner's LogitState: max_num_seqs slots and the neutral one (sampling_batch.py)."""
        return logit_state_shapes(self.buckets.max_num_seqs, self.config.vocab_size)

    def abstract_step_batch(self, num_tokens: int, decode_only: bool) -> StepBatch:
        rows = self.buckets.num_seq_rows(num_tokens)
        tokens = _abstract((num_tokens,), jnp.int32)
        return StepBatch(tokens, tokens, tokens, _abstract((rows, self.max_blocks_per_seq), jnp.int32),
                         _abstract((rows,), jnp.int32), _abstract((rows + 1,), jnp.int32),
                         _abstract((self.buckets.num_logits_rows,), jnp.int32),
                         lora_slots=None if self.lora_slots is None else tokens, decode_only=decode_only)


def abstract_sampling_batch(num_rows: int, vocab_size: int) -> SamplingBatch:
    """The sampler program's per-row input (its LogitState is an argument of its own): the shapes and dtypes
    pack_sampling_batch makes, so the two cannot drift apart, and the token bitmask the runner adds."""
    packed = pack_sampling_batch([], num_rows, neutral_slot=0)
    packed = packed.replace(token_bitmask=np.zeros((num_rows, bitmask_width(vocab_size)), np.int32))
    return jax.tree.map(lambda a: _abstract(a.shape, a.dtype), packed)


def _abstract(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))
