"""The sampler's log-normalizer gives a row the same bits alone as in a batch (the engine's
contract: a sequence's results never depend on the rest of its batch)."""
from __future__ import annotations

import torch

from encdec.sampling.sampler import logsumexp_rows
from tests.conftest import torch_threads


def test_a_lone_rows_log_normalizer_equals_its_batched_one():
    """torch sums a single vocabulary-long row on several threads, in another order than each
    row of a batch: for about one row in fifteen here the log-normalizer differed in its
    last bits, and with it the logprobs a lone request reported."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(128, 51864, generator=generator)
    scores[:, -1000:] = float("-inf")  # suppressed tokens
    with torch_threads(2):  # what splits a lone row (the test workers run on one)
        batched = logsumexp_rows(scores)
        alone = torch.cat([logsumexp_rows(scores[i:i + 1]) for i in range(len(scores))])
    assert torch.equal(alone, batched)
    torch.testing.assert_close(batched, torch.logsumexp(scores.double(), dim=-1).float())
