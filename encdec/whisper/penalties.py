"""faster-whisper's `repetition_penalty` and `no_repeat_ngram_size` for a window's decode.

They count the tokens the window decodes (its control tokens and text), not its prompt of
earlier text, as CTranslate2 applies them; `SamplingParams`' own, Hugging Face's, count the
prompt too. `OutputPenalties` is the window's first logits processor, so it acts before
Whisper's rules, as in CTranslate2.
"""
from __future__ import annotations

import torch

from encdec.sampling.logits_processors import ban_repeated_ngrams, repetition_penalty


class OutputPenalties:
    """Logits processor `(output_token_ids, logits_row) -> logits_row`; the sampler runs those
    of a batch together (`process_batch`)."""

    def __init__(self, repetition_penalty: float, no_repeat_ngram_size: int):
        self.repetition_penalty = repetition_penalty
        self.no_repeat_ngram_size = no_repeat_ngram_size

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.process_batch(logits[None], [0], [output_token_ids], [self])
        return logits

    @staticmethod
    def process_batch(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                      processors: list["OutputPenalties"]) -> None:
        """`processors[k]` on row `rows[k]` of `scores`, whose decoded tokens are `histories[k]`."""
        penalized = [k for k, p in enumerate(processors) if p.repetition_penalty != 1.0]
        if penalized:
            repetition_penalty(scores, [rows[k] for k in penalized], [histories[k] for k in penalized],
                               [processors[k].repetition_penalty for k in penalized])
        for size in sorted({p.no_repeat_ngram_size for p in processors if p.no_repeat_ngram_size}):
            picked = [k for k, p in enumerate(processors) if p.no_repeat_ngram_size == size]
            ban_repeated_ngrams(scores, [rows[k] for k in picked], [histories[k] for k in picked], size)
