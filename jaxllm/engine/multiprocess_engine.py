"""The server's engine on several processes: process 0 (the leader) tells the others what to do before each step.

    leader (serves HTTP)                           followers (processes 1 .. P-1)
    add_request / abort_request -> applied, recorded
    step(): broadcast [recorded..., "step"]  ----> apply the same calls in the same order; step()
    stop(): broadcast ["stop"]               ----> return from follow()

The engine is deterministic given these calls (distributed.py), so every process schedules the same step and
the processes call the jitted step together, each on its own devices. A message is JSON (request ids, prompts,
sampling parameters) broadcast with JAX's own collectives: a length, then the bytes padded to a power of two so
that few broadcast programs are compiled. An add the leader's engine refused is never sent.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from jaxllm.sampling_params import SamplingParams

MIN_MESSAGE_BYTES = 1024


class LeaderEngine:
    """The LLMEngine of process 0, with the same interface (AsyncEngine drives it unchanged): every step first
    broadcasts the requests added and aborted since the last one."""

    def __init__(self, engine):
        self.engine = engine
        self._pending: list[list[Any]] = []
        self.lost: str | None = None  # why the group broke (a follower gone: a collective with it failed)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None, **options) -> None:
        params = params or SamplingParams()
        command = ["add", request_id, prompt, dataclasses.asdict(params), options]  # before the engine sees it
        self.engine.add_request(request_id, prompt, params, **options)
        self._pending.append(command)

    def abort_request(self, request_ids) -> None:
        self.engine.abort_request(request_ids)
        self._pending.append(["abort", request_ids])

    def step(self):
        try:
            self._send(["step"])
            return self.engine.step()
        except Exception as e:  # the engine loop dies with it; a collective failed: the group is broken
            self.lost = f"{type(e).__name__}: {e}"
            raise

    def stop(self) -> None:
        """Release the followers (after the last step); `lost` says why not when the group is broken."""
        if self.lost is not None:
            return
        try:
            self._send(["stop"])
        except Exception as e:  # noqa: BLE001 - a follower is gone: nothing to release
            self.lost = f"{type(e).__name__}: {e}"

    def _send(self, last: list[Any]) -> None:
        commands, self._pending = [*self._pending, last], []
        broadcast(json.dumps(commands).encode())


def follow(engine) -> None:
    """Run `engine` on a follower process as the leader directs, until it stops."""
    while True:
        for command in json.loads(broadcast(None)):
            kind = command[0]
            if kind == "add":
                _, request_id, prompt, params, options = command
                engine.add_request(request_id, prompt, sampling_params_from_json(params), **options)
            elif kind == "abort":
                engine.abort_request(command[1])
            elif kind == "step":
                engine.step()
            elif kind == "stop":
                return
            else:
                raise RuntimeError(f"unknown command from process 0: {kind!r}")


def sampling_params_from_json(fields: dict[str, Any]) -> SamplingParams:
    """SamplingParams from dataclasses.asdict() sent through JSON (whose object keys are strings)."""
    if fields.get("logit_bias") is not None:
        fields = {**fields, "logit_bias": {int(token): bias for token, bias in fields["logit_bias"].items()}}
    return SamplingParams(**fields)


def broadcast(message: bytes | None) -> bytes:
    """Process 0's `message` on every process (the others pass None)."""
    from jax.experimental import multihost_utils

    length = np.asarray([0 if message is None else len(message)], np.int64)
    length = int(multihost_utils.broadcast_one_to_all(length)[0])
    size = max(MIN_MESSAGE_BYTES, 1 << (length - 1).bit_length())  # [size] uint8, a power of two
    buffer = np.zeros(size, np.uint8)
    if message is not None:
        buffer[:length] = np.frombuffer(message, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buffer))[:length].tobytes()
