"""The sampler's exponential noise (`exponential_like`): torch's `exponential_` stream, so a
seeded request samples what it sampled with `exponential_`, and the generator ends in the same
state for the request's next step."""
from __future__ import annotations

import pytest
import torch

from encdec.sampling.sampler import exponential_like


@pytest.mark.parametrize("shape", [(1, 1), (1, 17), (5, 51864), (32, 51865)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draws_what_exponential_draws_and_leaves_the_generator_alike(shape, dtype):
    for seed in range(3):
        theirs, ours = (torch.Generator().manual_seed(seed) for _ in range(2))
        expected = torch.empty(shape, dtype=dtype).exponential_(generator=theirs)
        got = exponential_like(torch.empty(shape, dtype=dtype), ours)
        assert got.dtype == dtype and torch.equal(got, expected)
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_the_default_generator_too():
    torch.manual_seed(11)
    expected = torch.empty(4, 5000).exponential_()
    torch.manual_seed(11)
    assert torch.equal(exponential_like(torch.empty(4, 5000), None), expected)
