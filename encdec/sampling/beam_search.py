"""Beam search with Hugging Face's exact rules (transformers `_beam_search`), one request at a time.

Each step the sampler ranks the request's best `(1 + number of stop tokens, at least 2) *
beam_width` continuations over all (beam, token) pairs by running score (the sum of processed
log-probabilities) with `top_candidates`. `BeamSearch.step` then:

- turns candidates among the first `beam_width` ranks that end in a stop token or complete a
  stop string, or reach `max_tokens`, into finished hypotheses scored `score / generated_len ** length_penalty`,
  where generated_len counts every token after the decoder prompt, this one included; the
  best `beam_width` hypotheses are kept;
- keeps the best `beam_width` unfinished candidates as the next running beams; candidates
  scored -inf (tokens that forced or banned tokens rule out) can never win and are dropped,
  from the beams and from the hypotheses alike, so a search where fewer than `n` sequences
  are possible returns fewer;
- decides whether the request is done: `early_stopping=True` once `beam_width` hypotheses are
  finished (`round(beam_width * patience)` with openai-whisper's `patience`); otherwise once the best running beam, normalised by the current generated length
  (by `max_tokens` for "never" with a positive length penalty), cannot beat the worst of a
  full set of hypotheses; and always when no candidate runs on.

Scores are float32 values, as in Hugging Face, so ties and rounding match.

`beam_rules="whisper"` follows openai-whisper's `BeamSearchDecoder` instead: walking the
candidates in rank order, those ending in a stop token before the `beam_width`-th other one
finish, and the first `round(beam_width * patience)` to finish are kept (none replaced); the
rest run on. The search ends once that many have finished, or at `max_tokens`, where running
beams make up the hypotheses to `beam_width`. Hypotheses are scored as its default ranker
does: the sum of the log-probabilities divided by the number of tokens before the stop token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from encdec.sampling.params import SamplingParams


class Candidate(Protocol):
    parent_seq_id: int
    token_id: int
    beam_score: float


@dataclass
class BeamHypothesis:
    token_ids: list[int]  # every generated token, the last one included
    score: float  # cumulative_logprob / generated_len ** length_penalty
    cumulative_logprob: float
    finish_reason: str  # "stop" (a stop token or string) or "length"


def top_candidates(logprobs: torch.Tensor, running_scores: list[list[float]],
                   count: int) -> list[tuple[list[float], list[int], list[int], list[float]]]:
    """Per request of `logprobs` [requests, beams, vocab]: the scores, parent rows, tokens and
    log-probabilities of its `count` best continuations, ranked as Hugging Face ranks them
    over the flattened (beam, token) pairs. Requests of one shape are ranked in one call."""
    requests, beams, vocab = logprobs.shape
    running = torch.tensor(running_scores, dtype=logprobs.dtype, device=logprobs.device)
    totals = (logprobs + running[:, :, None]).view(requests, beams * vocab)
    values, index = totals.topk(min(count, beams * vocab), dim=1)
    rows, tokens = index // vocab, index % vocab
    token_logprobs = logprobs[torch.arange(requests, device=index.device)[:, None], rows, tokens]
    return list(zip(values.tolist(), rows.tolist(), tokens.tolist(), token_logprobs.tolist()))


def num_candidates(params: SamplingParams, num_stop_ids: int) -> int:
    """How many continuations a step ranks: enough that `beam_width` of them do not stop."""
    return max(2, 1 + num_stop_ids) * params.beam_width


class BeamSearch:
    """The finished hypotheses of one request and whether its search is over."""

    def __init__(self, params: SamplingParams):
        assert params.use_beam_search and params.beam_width >= 1 and params.max_tokens is not None
        self.params = params
        self.finished: list[BeamHypothesis] = []
        self.improvable = True  # Hugging Face's is_early_stop_heuristic_unsatisfied
        self.done = False
        self.num_ended = 0  # hypotheses that finished, kept or not
        self.max_candidates = params.max_candidates

    def step(self, candidates: list[Candidate], outputs: dict[int, list[int]],
             is_stop: Callable[[Candidate], bool]) -> list[Candidate]:
        """Take ranked candidates (parents' output ids in `outputs`); return the next beams.
        `is_stop(candidate)`: whether its token ends its sequence (a stop token, or the end of
        a stop string)."""
        assert not self.done
        params, width = self.params, self.params.beam_width
        generated = len(next(iter(outputs.values()))) + 1  # all beams grow in lockstep
        if params.beam_rules == "whisper":
            return self._whisper_step(candidates, outputs, is_stop, generated)
        ended, running = [], []  # ended: (candidate, is_stop) among the first `width` ranks
        for rank, c in enumerate(candidates):
            if rank >= width and len(running) == width:
                break  # no later candidate can finish or run (stop strings are not cheap to check)
            stop = is_stop(c)
            if stop or generated >= params.max_tokens:
                if rank < width and c.beam_score > -math.inf:
                    ended.append((c, stop))
            elif c.beam_score > -math.inf and len(running) < width:
                running.append(c)
        self.num_ended += len(ended)
        scores = _normalize([c.beam_score for c, _ in ended], generated, params.length_penalty)
        self.finished = sorted(self.finished + [
            BeamHypothesis(outputs[c.parent_seq_id] + [c.token_id], score, c.beam_score,
                           "stop" if stop and not params.is_forced_end(generated, c.token_id) else "length")
            for (c, stop), score in zip(ended, scores)], key=lambda h: -h.score)[:width]
        full = len(self.finished) == width
        if running and full:
            length = generated
            if params.early_stopping == "never" and params.length_penalty > 0:
                length = params.max_tokens
            (best,) = _normalize([running[0].beam_score], length, params.length_penalty)
            self.improvable = self.improvable and best > self.finished[-1].score
        self.done = (not running or not self.improvable
                     or (params.early_stopping is True and self.num_ended >= self.max_candidates))
        return [] if self.done else running

    def _whisper_step(self, candidates: list[Candidate], outputs: dict[int, list[int]],
                      is_stop: Callable[[Candidate], bool], generated: int) -> list[Candidate]:
        """One step under openai-whisper's rules (the module docstring)."""
        width = self.params.beam_width
        ended, running = [], []
        for c in candidates:
            if is_stop(c):
                ended.append((c, "stop"))
            elif c.beam_score > -float("inf"):
                running.append(c)
                if len(running) == width:
                    break
        at_end = generated >= self.params.max_tokens
        kept = ended[:max(0, self.max_candidates - len(self.finished))]
        if at_end:
            kept += [(c, "length") for c in running[:max(0, width - len(self.finished) - len(kept))]]
        for c, reason in kept:
            text_len = generated - (reason == "stop")
            self.finished.append(BeamHypothesis(outputs[c.parent_seq_id] + [c.token_id],
                                                c.beam_score / max(text_len, 1), c.beam_score, reason))
        self.done = at_end or not running or len(self.finished) >= self.max_candidates
        return [] if self.done else running

    def best(self, n: int) -> list[BeamHypothesis]:
        if self.params.beam_rules == "whisper":
            return sorted(self.finished, key=lambda h: -h.score)[:n]
        return self.finished[:n]

    def cut_short(self, beams: list[tuple[list[int], float]], n: int) -> list[BeamHypothesis]:
        """The best `n` of the finished hypotheses and the running `beams` (output ids, running
        score) of a search stopped before its end (aborted): each beam is scored as a hypothesis
        of its length would be, and its finish_reason is "abort"."""
        def score(total: float, length: int) -> float:
            if self.params.beam_rules == "whisper":
                return total / length
            return _normalize([total], length, self.params.length_penalty)[0]

        cut = [BeamHypothesis(list(ids), score(total, max(len(ids), 1)), total, "abort") for ids, total in beams]
        return sorted(self.finished + cut, key=lambda h: -h.score)[:n]


def _normalize(scores: list[float], length: int, length_penalty: float) -> list[float]:
    try:
        divisor = length ** length_penalty
    except OverflowError:  # a huge length_penalty: every score is 0, as its limit is
        divisor = math.inf
    return (torch.tensor(scores, dtype=torch.float32) / divisor).tolist()
