"""faster-whisper's `repetition_penalty` and `no_repeat_ngram_size`, and OpenAI's
`presence_penalty` and `frequency_penalty`, for a window's decode.

They count the tokens the window decodes (its control tokens and text), not its prompt of
earlier text, as CTranslate2 applies the first two (and vLLM the others, to a request's output);
`SamplingParams`' repetition penalty and n-grams, Hugging Face's, count the prompt too.
`OutputPenalties` is the window's first logits processor, so it acts before Whisper's rules, as
in CTranslate2.
"""
from __future__ import annotations

import torch

from encdec.sampling.logits_processors import apply_penalties


class OutputPenalties:
    """Logits processor `(output_token_ids, logits_row) -> logits_row`; the sampler runs those
    of a batch together (`process_batch`)."""

    def __init__(self, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0):
        self.repetition_penalty = repetition_penalty
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty

    @property
    def active(self) -> bool:
        return (self.repetition_penalty != 1.0 or bool(self.no_repeat_ngram_size) or bool(self.presence_penalty)
                or bool(self.frequency_penalty))

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.process_batch(logits[None], [0], [output_token_ids], [self])
        return logits

    @staticmethod
    def process_batch(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                      processors: list["OutputPenalties"]) -> None:
        """`processors[k]` on row `rows[k]` of `scores`, whose decoded tokens are `histories[k]`."""
        apply_penalties(scores, rows, processors, histories.__getitem__, histories.__getitem__)
