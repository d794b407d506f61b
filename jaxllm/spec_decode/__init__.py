"""Speculative decoding (vLLM's speculative_config): n-gram proposals made on the host, or a draft model's,
verified by the target model in the ragged step.

    config.py      SpeculativeConfig: the settings, checked
    draft_model.py DraftProposer: a draft model's greedy proposals (its own runner and block pool)
    ngram.py       propose_ngram: the tokens that followed the longest earlier match of the context's suffix
    rejection.py   accept_run: the verified tokens of one sequence from its k + 1 sampled rows
    eligibility.py which requests speculate (per request, and when acceptance stays low)
    metrics.py     SpecDecodingStats: vLLM's spec_decode counters
"""

from jaxllm.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
