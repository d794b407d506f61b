"""Structured outputs: a request's output constrained to a JSON schema, a regex, a choice or a grammar (xgrammar).

    params.py         StructuredOutputsParams (vLLM's names), parsed and checked off the engine thread
    compiler.py       GrammarCompiler: compiled against the vocabulary on a worker thread, cached by text
    request_state.py  RequestGrammar: one request's matcher (accept, rollback, the next-token bitmask)

The engine fills each constrained row's token bitmask on the host after the previous step's tokens are back, and
the sampler program applies it on the device (sampler.apply_token_bitmask): one program for every mix.
"""

from jaxllm.structured_outputs.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
