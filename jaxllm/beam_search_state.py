"""BeamSearchInstance: the beam search of one prompt, step by step, as Hugging Face's generate(num_beams=W).

Host-side only: each step the caller runs the model on every running beam (one engine request per beam, whose
prompt is the beam's tokens) and hands back each beam's K best next tokens with their logprobs; `advance` then

    1. ranks every beam's candidates by cum_logprob + logprob and keeps the step's K best (of all beams);
    2. continues the W best of those that do not end (EOS, or the length limit) as the running beams;
    3. moves those of the W best that end into the finished set, scored cum_logprob / generated_len ** lp
       (generated_len counts the EOS), keeping the W best finished hypotheses;
    4. decides whether to stop (early_stopping, see beam_search.py).

    step t:   running beams (W)  --each: its K best tokens-->  W*K candidates  --K best-->  top K
              top K  --not ending, W best-->  running beams of step t + 1
              top K[:W]  --ending-->  finished (the W best scores kept)
"""

from __future__ import annotations

import dataclasses

from jaxllm.beam_search import BeamSearchParams, BeamSearchSequence, get_beam_search_score
from jaxllm.outputs import Logprob


@dataclasses.dataclass
class Beam:
    tokens: list[int]  # generated so far
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float


@dataclasses.dataclass
class Finished:
    beam: Beam
    score: float
    ended_on_eos: bool


class BeamSearchInstance:
    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: tuple[int, ...],
                 limit: int, lora_request=None):
        """limit: the most tokens a beam may generate (max_tokens, or less where the context ends first)."""
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self.k = params.candidates_per_beam(len(eos_token_ids))
        self.limit = limit
        self.lora_request = lora_request
        self.running = [Beam([], [], 0.0)]
        self.finished: list[Finished] = []
        self.improvable = True  # HF's early-stop heuristic: a running beam could still beat a finished one
        self.done = False

    def beam_prompts(self) -> list[list[int]]:
        """The token ids of each running beam: the prompts of this step's engine requests."""
        return [self.prompt_token_ids + beam.tokens for beam in self.running]

    def advance(self, tops: list[dict[int, Logprob]]) -> None:
        """tops[i]: running beam i's K best next tokens -> their Logprob."""
        if len(tops) != len(self.running):
            raise ValueError(f"got candidates for {len(tops)} beams, {len(self.running)} are running")
        length = len(self.running[0].tokens) + 1  # generated tokens after this step
        ranked = sorted(((beam.cum_logprob + lp.logprob, i, token) for i, beam in enumerate(self.running)
                         for token, lp in tops[i].items()), key=lambda c: (-c[0], c[1], c[2]))[:self.k]
        ends = [length >= self.limit or token in self.eos for _, _, token in ranked]
        self._finish([c for c, end in zip(ranked[:self.params.beam_width], ends) if end], tops, length)
        self.running = [self._extend(c, tops) for c, end in zip(ranked, ends) if not end][:self.params.beam_width]
        self._check_done(all(ends), length)

    def _extend(self, candidate, tops) -> Beam:
        cum, i, token = candidate
        parent = self.running[i]
        return Beam(parent.tokens + [token], parent.logprobs + [tops[i]], cum)

    def _finish(self, ending: list, tops, length: int) -> None:
        """Score the ending candidates of the W best, unless the finished set can take no more (HF: full with
        early_stopping True, or no improvement possible)."""
        full = len(self.finished) == self.params.beam_width
        if not self.improvable or (full and self.params.early_stopping is True):
            return
        for candidate in ending:
            beam = self._extend(candidate, tops)
            score = get_beam_search_score(length, beam.cum_logprob, self.params.length_penalty)
            self.finished.append(Finished(beam, score, beam.tokens[-1] in self.eos))
        self.finished.sort(key=lambda f: -f.score)
        del self.finished[self.params.beam_width:]

    def _check_done(self, all_end: bool, length: int) -> None:
        params = self.params
        full = len(self.finished) == params.beam_width
        if self.running and full:
            never = params.early_stopping == "never"
            best_length = self.limit if never and params.length_penalty > 0 else length
            best_possible = self.running[0].cum_logprob / best_length ** params.length_penalty
            self.improvable = self.improvable and best_possible > self.finished[-1].score
        self.done = all_end or not self.running or not self.improvable or \
            (full and params.early_stopping is True)

    def sequences(self) -> list[BeamSearchSequence]:
        """The finished hypotheses, best first (vLLM's BeamSearchSequence; text is filled by the caller)."""
        out = []
        for f in self.finished:
            eos = f.beam.tokens[-1] if f.ended_on_eos else None
            out.append(BeamSearchSequence(
                self.prompt_token_ids + f.beam.tokens, f.beam.logprobs, self.lora_request, f.beam.cum_logprob,
                finish_reason="stop" if f.ended_on_eos else "length", stop_reason=eos, score=f.score,
                num_prompt_tokens=len(self.prompt_token_ids)))
        return out
