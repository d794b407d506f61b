"""Sizes shared by the kernels' tilings and the engine's shape buckets."""


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton block dims must be powers of two, and the engine's
    buckets are powers of two."""
    return 1 << max(n - 1, 0).bit_length()
