"""Benchmark building blocks: the jitted timing harness, model shape presets and synthetic datasets."""
