"""Several processes (one per host) running one model: jax.distributed joins them, the mesh spans their devices.

JAX runs multi-process programs SPMD ("multi-controller"): every process runs the same Python program and calls
the same jitted step on the same inputs; each process feeds and reads only its own devices. jaxllm keeps that
model all the way up:

- The engine is deterministic given its inputs (the scheduler, the block pool and the sampler's random streams
  depend only on the requests added and the tokens sampled, which the step returns replicated to every process).
  So every process runs the whole engine, and the processes stay in step as long as they see the same requests
  in the same order between the same steps.
- Offline (`LLM`, `jaxllm generate`): every process runs the same script with the same prompts; the outputs are
  the same on every process (print them from process 0).
- Server (`jaxllm serve`): only process 0 serves HTTP. Before each step it broadcasts the requests added and
  aborted since the last one; the other processes apply them and step too (engine/multiprocess_engine.py).

Settings: EngineArgs num_processes, process_id and coordinator_address (flags --num-processes, --process-id,
--coordinator-address), or the environment variables in ENVIRONMENT when a flag is not given.
"""

from __future__ import annotations

import dataclasses
import os
import socket

import jax
import numpy as np

ENVIRONMENT = {"num_processes": "JAXLLM_NUM_PROCESSES", "process_id": "JAXLLM_PROCESS_ID",
               "coordinator_address": "JAXLLM_COORDINATOR_ADDRESS"}


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None

    def __post_init__(self):
        if self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process_id must be in [0, {self.num_processes}) for {self.num_processes} "
                             f"processes, got {self.process_id}")
        if self.num_processes > 1 and not self.coordinator_address:
            raise ValueError(f"coordinator_address (host:port of process 0) is needed for {self.num_processes} "
                             f"processes; set --coordinator-address or {ENVIRONMENT['coordinator_address']}")
        if self.coordinator_address is not None and not _is_host_port(self.coordinator_address):
            raise ValueError(f"coordinator_address must be host:port, got {self.coordinator_address!r}")


def process_group(num_processes: int | None, process_id: int | None,
                  coordinator_address: str | None) -> ProcessGroup:
    """The group from the given settings, each missing one read from its environment variable."""
    given = {"num_processes": num_processes, "process_id": process_id, "coordinator_address": coordinator_address}
    values = {name: value if value is not None else os.environ.get(ENVIRONMENT[name])
              for name, value in given.items()}
    for name in ("num_processes", "process_id"):
        if isinstance(values[name], str):
            try:
                values[name] = int(values[name])
            except ValueError:
                raise ValueError(f"{ENVIRONMENT[name]} must be an integer, got {values[name]!r}") from None
    return ProcessGroup(**{name: value for name, value in values.items() if value is not None})


def initialize(group: ProcessGroup) -> None:
    """Join the other processes (a no-op for one process, or when this process already joined). Must run before
    JAX starts its backends (before the first array is made)."""
    if group.num_processes == 1:
        return
    if jax.distributed.is_initialized():
        _check_joined_as(group)
        return
    if group.process_id == 0:
        _check_coordinator_port_free(group.coordinator_address)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # collectives of CPU devices across processes
    try:
        jax.distributed.initialize(group.coordinator_address, num_processes=group.num_processes,
                                   process_id=group.process_id)
    except RuntimeError as e:
        raise ValueError(f"joining {group.num_processes} processes at {group.coordinator_address} as process "
                         f"{group.process_id} failed (is process 0 running there? JAX must not have started "
                         f"before joining): {e}") from e


def _check_coordinator_port_free(address: str) -> None:
    """Process 0's coordinator listens on every interface at the address's port; a port taken makes JAX's
    coordinator crash the process (SIGSEGV), so it is checked first (the same way it binds: any address,
    reusable)."""
    port = int(address.rpartition(":")[2])
    family, any_host = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "0.0.0.0")
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((any_host, port))
        except OSError as e:
            raise ValueError(f"coordinator_address {address}: port {port} is already in use on this host (process "
                             f"0 listens there for the others to join): {e.strerror}") from None


def tensor_parallel_size(requested: int | None, group: ProcessGroup) -> int | None:
    """With several processes the mesh spans every device of every process: `requested` must be that many (None
    means that many). One process: `requested` as it is."""
    if group.num_processes == 1:
        return requested
    total = jax.device_count()
    if requested not in (None, total):
        raise ValueError(f"tensor_parallel_size {requested}: {group.num_processes} processes split the model over "
                         f"all their {total} devices; set it to {total} or leave it unset")
    return total


def process_index() -> int:
    """This process's index (0: the one that serves HTTP and prints)."""
    return jax.process_index()


def agree_on_minimum(value: int) -> int:
    """The smallest of every process's `value` (e.g. KV blocks that fit: the pool must have one shape)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.min(multihost_utils.process_allgather(np.asarray([value], np.int64))))


def _check_joined_as(group: ProcessGroup) -> None:
    if jax.process_count() != group.num_processes or jax.process_index() != group.process_id:
        raise RuntimeError(f"this process already joined as process {jax.process_index()} of "
                           f"{jax.process_count()}, not {group.process_id} of {group.num_processes}")


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()
