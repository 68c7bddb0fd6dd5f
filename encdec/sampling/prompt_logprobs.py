"""vLLM's `prompt_logprobs`: how likely each decoder prompt token is, given the ones before it.

The logits come from the prefill's hidden states (all its rows but the last, which samples), as
the model gives them: no logits processor and no temperature. The first prompt token has no
log-probability (None), as in vLLM. Each entry has its rank among all tokens: the prompt token's
is one more than the number of tokens likelier than it, the top k's are 1 to k (vLLM's ranks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from encdec.outputs import PromptLogprobs, logprob_entry


@dataclass
class PromptRows:
    """One prefill's rows in the step's hidden states and the prompt tokens they predict."""

    request_id: str
    rows: slice
    next_token_ids: list[int]
    num_top: int


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], num_top: int) -> PromptLogprobs:
    """Per prompt token: the `num_top` likeliest tokens at its place and itself, with their
    log-probabilities and ranks. `logits` [len(next_token_ids), vocab] are those of the tokens before."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(next_token_ids, device=logprobs.device)
    chosen = logprobs.gather(1, ids[:, None])
    ranks = ((logprobs > chosen).sum(-1) + 1).tolist()
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    result: PromptLogprobs = [None]
    for token, logprob, rank, values, ids_row in zip(next_token_ids, chosen.squeeze(1).tolist(), ranks,
                                                     top_values.tolist(), top_ids.tolist()):
        result.append(logprob_entry(ids_row, values, token, logprob, rank))
    return result
