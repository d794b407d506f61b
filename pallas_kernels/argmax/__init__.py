"""Row argmax (the sampler's greedy choice): cpu.py holds the native CPU kernel, reference.py the contract."""
