"""The rule for request fields jaxllm does not declare (protocol.py declares what it implements):

    a field of vLLM's request models that jaxllm does not implement  -> 400 "<field> is not supported"
                                                                        (param: the field), unless its value is
                                                                        one that changes nothing (its default)
    a field vLLM's models have that changes nothing here             -> accepted
    a field vLLM does not know either                                 -> ignored, with a debug log, as vLLM

So a client written for vLLM gets what it asked for or an error naming the field, never a silent 200 that
dropped it. The lists follow vLLM's CompletionRequest and ChatCompletionRequest (their sampling and extra
parameters, the tool fields), as of vLLM 0.34. The structured-output fields are declared
(structured_fields.py).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

ANY = object()  # every value is accepted: the field changes nothing here

# field -> the values that leave it unused (clients that send every default)
_NOT_SUPPORTED_ANYWHERE: dict[str, tuple] = {
    "logits_processors": (None,), "cache_salt": (None,), "kv_transfer_params": (None,),
    "vllm_xargs": (None,), "mm_processor_kwargs": (None,),
    "watermarking": (None, False), "return_weight_versions": (False,),
    "ec_transfer_params": (None,), "repetition_detection": (None,), "stream_interval": (None, 1),
    "thinking_token_budget": (None,),
    # what only vLLM's render endpoints, expert routing reports or session routing read: no effect here
    "session_id": ANY, "routed_experts_prompt_start": ANY, "return_token_offsets": ANY, "mm_payload": ANY,
    "return_mm_kwargs": ANY,
}
_COMPLETION: dict[str, tuple] = {**_NOT_SUPPORTED_ANYWHERE, "prompt_embeds": (None,),
                                 "add_special_tokens": (True,)}
_CHAT: dict[str, tuple] = {
    **_NOT_SUPPORTED_ANYWHERE, "add_special_tokens": (False,),
    "documents": (None,), "reasoning_effort": (None,),
    "media_io_kwargs": (None,), "return_prompt_text": (None, False),
    "include_reasoning": ANY,  # it acts only with a reasoning parser
}
FIELDS = {"completion": _COMPLETION, "chat": _CHAT}


def unsupported_field(extra: dict[str, Any] | None, kind: str) -> str | None:
    """The first field of `extra` (the request's undeclared fields) that asks for what jaxllm does not do;
    fields vLLM does not know are logged and ignored."""
    known = FIELDS[kind]
    for name, value in (extra or {}).items():
        unused = known.get(name)
        if unused is None:
            logger.debug("request field %r is not an OpenAI or vLLM field: ignored", name)
        elif unused is not ANY and not any(_same(value, u) for u in unused):
            return name
    return None


def _same(value: Any, unused: Any) -> bool:
    if unused is None or isinstance(unused, bool):
        return value is unused
    if isinstance(unused, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == unused
    return type(value) is type(unused) and value == unused
