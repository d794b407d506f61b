"""Hugging Face's beam search as the oracle of jaxllm's: generate(num_beams=W) and its W best hypotheses."""

from __future__ import annotations

import torch


def hf_beams(hf, prompt: list[int], eos: int, width: int, max_tokens: int, length_penalty: float,
             early_stopping) -> list[tuple[list[int], float]]:
    """HF's W best hypotheses, best first: (generated tokens up to and including the EOS, score)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          num_beams=width, num_return_sequences=width, do_sample=False, max_new_tokens=max_tokens,
                          length_penalty=length_penalty, early_stopping=early_stopping, eos_token_id=eos,
                          pad_token_id=eos, output_scores=True, return_dict_in_generate=True)
    beams = []
    for sequence, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        generated = sequence[len(prompt):]
        if eos in generated:
            generated = generated[:generated.index(eos) + 1]
        beams.append((generated, score))
    return beams
