"""A KV cache too small for the batch: preemption by swap and by recompute keep HF parity."""
from __future__ import annotations

import pytest

from encdec import LLM
from tests.bart_parity import mixed_prompts, run_parity
from tests.conftest import assert_all_blocks_free


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_parity_under_preemption(tiny_bart_dir, mode):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=14, block_size=8, swap_space=0.01,
              preemption_mode=mode)
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [20 + (7 * i) % 20 for i in range(len(prompts))]
    run_parity(tiny_bart_dir, llm, prompts, max_tokens)
    stats = llm.llm_engine.stats
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swap_outs > 0 and stats.num_swap_ins == stats.num_swap_outs
        assert stats.num_recomputes == 0
        assert stats.num_encoder_runs == len(prompts)  # swapped cross blocks are kept
    else:
        assert stats.num_recomputes > 0 and stats.num_swap_outs == 0
        assert stats.num_encoder_runs == len(prompts) + stats.num_recomputes  # encoder re-runs
    assert_all_blocks_free(llm)


def test_request_larger_than_cache_is_refused(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=4, block_size=8)
    from encdec import SamplingParams
    with pytest.raises(ValueError, match="num_gpu_blocks=4"):
        llm.generate("The rain in spain falls mainly on the plain.", SamplingParams(max_tokens=100))
    assert_all_blocks_free(llm)
