"""A randomized run: requests arrive and are aborted at random steps, in a cache sized to the
exact boundary of the largest request, under both preemption modes, with greedy, seeded n > 1
sampling and beam search. Every request that is not aborted must give what it gives alone."""
from __future__ import annotations

import random

import pytest

from encdec import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free

PROMPTS = ["The rain in spain falls mainly on the plain.", "Paged attention keeps keys in blocks.",
           "An encoder reads the whole document once; the decoder writes one token at a time.",
           "Numbers like 3, 14, 159 and 2026 appear in reports.", "Continuous batching.",
           "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun."]


def random_params(rng: random.Random) -> SamplingParams:
    max_tokens = rng.randint(1, 24)
    kind = rng.choice(["greedy", "sample", "beam"])
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.5)
    if kind == "sample":
        return SamplingParams(temperature=1.0, seed=rng.randrange(1000), n=rng.randint(1, 3),
                              max_tokens=max_tokens, ignore_eos=rng.random() < 0.5)
    return SamplingParams(use_beam_search=True, beam_width=rng.randint(2, 3), temperature=0.0,
                          max_tokens=max(2, max_tokens))


def boundary_blocks(llm: LLM, requests) -> int:
    """The fewest device blocks that still admit every request (watermark included)."""
    engine = llm.llm_engine
    tokenizer = llm.get_tokenizer()
    size = engine.cache_config.block_size
    need = max(-(-len(tokenizer(p)["input_ids"]) // size) + params.max_num_seqs * -(-(2 + params.max_tokens) // size)
               for p, params in requests)
    return need + int(0.01 * need) + 1


@pytest.fixture(scope="module")
def alone(tiny_bart_dir):
    return LLM(model=str(tiny_bart_dir), num_gpu_blocks=1000, block_size=4)


@pytest.fixture(scope="module", params=[0, 1])
def scenario(request, alone):
    """Random requests and what each gives run alone."""
    rng = random.Random(request.param)
    requests = [(rng.choice(PROMPTS), random_params(rng)) for _ in range(14)]
    return rng, requests, [alone.generate(p, params, use_tqdm=False)[0] for p, params in requests]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_random_arrivals_and_aborts_at_the_cache_boundary(tiny_bart_dir, alone, scenario, mode):
    rng, requests, expected = scenario
    rng = random.Random(rng.random())
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=boundary_blocks(alone, requests),
              block_size=4, swap_space=0.05, preemption_mode=mode, max_num_seqs=8)
    engine = llm.llm_engine
    arrivals = sorted(rng.randrange(30) for _ in requests)
    aborts = {i: rng.randrange(1, 40) for i in rng.sample(range(len(requests)), 3)}
    finished, step = {}, 0
    while len(finished) + len(aborts) < len(requests) or engine.has_unfinished_requests():
        for i, at in enumerate(arrivals):
            if at == step:
                engine.add_request(str(i), *requests[i])
        for i, at in aborts.items():
            if at == step:
                engine.abort_request(str(i))
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        engine.block_manager.check_invariants()
        step += 1
        assert step < 2000
    for i, want in enumerate(expected):
        if i in aborts and str(i) not in finished:
            continue
        got = finished[str(i)]
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs], (i, requests[i][1])
    assert_all_blocks_free(llm)
    stats = engine.stats
    print(f"{mode}: {stats.num_preemptions} preemptions, {stats.num_swap_outs} swaps, "
          f"{stats.num_recomputes} recomputes")
