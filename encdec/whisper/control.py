"""The control tokens of one Whisper window, decided inside the batch.

A window's decoder prompt ends at <|startoftranscript|>; the tokens that follow it in
openai-whisper's prefix (<|lang|>, <|task|>, and <|notimestamps|> without timestamps) are
forced one step at a time by `ControlProcessor`, a per-request logits processor. The first
step's logits are the raw logits at the sot position, which is where openai-whisper and
faster-whisper read `no_speech_prob`: softmax(raw logits)[<|nospeech|>].

Language detection is a request of its own, as in both references: the decoder prompt is
<|startoftranscript|> alone (no prompt text, which would sway it), and its one step forces
`DETECT`, the argmax over the language tokens; its probability is the softmax over those
tokens alone, as both references compute it.

Forced tokens get log-probability 0 (every other logit is -inf), so the request's
cumulative log-probability is that of the sampled tokens alone. After the prefix, the
decoding rules (`encdec.whisper.decoding`) apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from encdec.whisper.decoding import DecodingRules, apply_rules
from encdec.whisper.tokens import WhisperTokens

DETECT = "detect"  # placeholder in a control prefix: the language token to detect


@dataclass
class WindowState:
    """What the control steps learned about one window (`language`: a detection's, with its
    probability among the language tokens)."""

    no_speech_prob: float = 0.0
    language: Optional[str] = None
    language_probability: float = 1.0


def control_prefix(tokens: WhisperTokens, language: Optional[str], task: str, timestamps: bool) -> list[int]:
    """The tokens to force after sot (English-only models have no language token)."""
    return list(tokens.decoder_prefix(language, task, timestamps)[1:])


class ControlProcessor:
    """Logits processor `(output_token_ids, logits_row) -> logits_row` for one window; the
    sampler runs those of a batch together (`process_batch`)."""

    def __init__(self, tokens: WhisperTokens, prefix: list[Union[int, str]],
                 rules: DecodingRules, state: WindowState):
        self.tokens = tokens
        self.prefix = prefix
        self.rules = rules
        self.state = state
        self.language_ids = torch.tensor(sorted(tokens.lang_to_id.values()), dtype=torch.long)

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.process_batch(logits[None], [0], [output_token_ids], [self])
        return logits

    @staticmethod
    def process_batch(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                      processors: list["ControlProcessor"]) -> None:
        """`processors[k]` on row `rows[k]` of `scores`: control steps row by row, the decoding
        rules for all other rows at once (`apply_rules`)."""
        ruled = []
        for row, history, processor in zip(rows, histories, processors):
            if not processor._control_step(history, scores[row]):
                ruled.append((row, history[len(processor.prefix):], processor.rules))
        if ruled:
            apply_rules(scores, *map(list, zip(*ruled)))

    def _control_step(self, output_token_ids: list[int], logits: torch.Tensor) -> bool:
        """Read the first step's no-speech probability; force a prefix token (True) if one
        is due."""
        step = len(output_token_ids)
        if step == 0 and self.tokens.no_speech is not None:
            probs = torch.softmax(logits.float(), dim=-1)
            self.state.no_speech_prob = probs[self.tokens.no_speech].item()
        if step >= len(self.prefix):
            return False
        token = self.prefix[step]
        if token == DETECT:
            probs = torch.softmax(logits[self.language_ids].float(), dim=-1)
            best = int(probs.argmax())
            token = int(self.language_ids[best])
            self.state.language = self.tokens.language_of(token)
            self.state.language_probability = probs[best].item()
        logits.fill_(float("-inf"))
        logits[token] = 0.0
        return True
