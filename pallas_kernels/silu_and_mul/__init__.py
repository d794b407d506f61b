"""The gated MLP's SiLU and product (SwiGLU): cpu.py holds the native CPU kernel, reference.py the contract."""
