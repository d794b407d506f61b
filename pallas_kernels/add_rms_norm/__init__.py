"""A decoder layer's residual add and RMS norm: cpu.py holds the native CPU kernel, reference.py the contract."""
