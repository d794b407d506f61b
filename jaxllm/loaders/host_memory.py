"""What a model's config asks the host to hold, checked against the machine's memory before anything is allocated.

Every loader reads the params into host memory first (loaders.load_host_model), so a config whose shapes (one
absurd integer is enough: num_hidden_layers = 10**9) make more parameters than the machine can hold is refused
while it is still only a config, by a ModelLoadError naming the file and the sizes.
"""

from __future__ import annotations

import os

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.model.params import param_count

PER_LAYER_OVERHEAD_BYTES = 4096  # the host objects of one layer besides its arrays' data (lists, headers)


def host_memory_bytes() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_fits_host(config: ModelConfig, source: object, bytes_per_param: float) -> None:
    """ModelLoadError naming `source` when the config's params, at bytes_per_param each (their dtype's size, or
    less for packed weights), need more than the machine's memory."""
    memory = host_memory_bytes()
    if memory is None:
        return
    count = param_count(config)
    needed = count * bytes_per_param + config.num_layers * PER_LAYER_OVERHEAD_BYTES
    if needed > memory:
        raise ModelLoadError(source, f"the config describes {count:.4g} parameters (num_layers {config.num_layers}, "
                             f"hidden_size {config.hidden_size}, intermediate_size {config.intermediate_size}, "
                             f"vocab_size {config.vocab_size}, num_heads {config.num_heads} x head_dim "
                             f"{config.head_dim}): {needed / 2**30:.4g} GiB, more than this machine's "
                             f"{memory / 2**30:.4g} GiB of memory")
