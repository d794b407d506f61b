"""Pallas kernels for NVIDIA GPUs, one folder per kernel, each with a plain-jnp reference beside it."""
