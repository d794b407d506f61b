"""Weights stored as Intel AMX tiles and their matmul on the CPU: cpu.py holds the native kernel, reference.py the
contract (the layout and its dot)."""
