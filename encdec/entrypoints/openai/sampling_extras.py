"""What OpenAI's completions ask for that the engine does not do itself: `logit_bias`."""
from __future__ import annotations

import torch

from encdec.entrypoints.openai.errors import bad_request


class LogitBias:
    """OpenAI's `logit_bias`: add a bias to some tokens' logits (a per-sequence logits processor)."""

    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()))

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits[self.ids.to(logits.device)] += self.values.to(logits.device, logits.dtype)
        return logits


def logit_bias(bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    parsed = {}
    for token, value in bias.items():
        if not (token.isascii() and token.isdigit() and len(token) <= 9) or int(token) >= vocab_size:
            raise bad_request(f"logit_bias: {token[:20]!r} is not a token id of this model "
                              f"(vocab_size={vocab_size})", "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"logit_bias: {value} is outside [-100, 100]", "logit_bias")
        parsed[int(token)] = value
    return parsed
