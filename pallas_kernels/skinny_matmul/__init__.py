"""Skinny matmuls (a few activation rows times a dense weight) on the CPU: cpu.py holds the native kernel,
reference.py the contract."""
