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


@pytest.mark.parametrize("mode", [None, "recompute"])
def test_multi_sequence_groups_are_recomputed_without_swap_space(tiny_bart_dir, mode):
    """n=2 samples and beam searches preempted with no swap space (or by `preemption_mode`) are
    prefilled again, every sequence of the group, and end as in a cache that never preempts
    (they used to fail the whole batch: "cannot swap out a multi-sequence request")."""
    from encdec import SamplingParams

    prompts = ["quick brown fox", "Numbers like 3, 14", "The rain in spain", "An encoder reads"] * 3
    searches = [SamplingParams(temperature=1.0, seed=0, n=2, max_tokens=40, ignore_eos=True),
                SamplingParams(temperature=0.0, beam_width=3, n=2, max_tokens=24, ignore_eos=True)]
    roomy = LLM(model=str(tiny_bart_dir), num_gpu_blocks=400, block_size=8)
    tight = LLM(model=str(tiny_bart_dir), num_gpu_blocks=30, block_size=8, swap_space=0, preemption_mode=mode)
    for params in searches:
        expected = roomy.generate(prompts, params, use_tqdm=False)
        runs = tight.llm_engine.stats.num_recomputes
        got = tight.generate(prompts, params, use_tqdm=False)
        assert tight.llm_engine.stats.num_recomputes > runs
        assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in expected]
        assert_all_blocks_free(tight)
    assert tight.llm_engine.stats.num_swap_outs == 0
