"""Preemption by swap on cuda: blocks move between the GPU cache and the pinned CPU swap pool,
outputs equal an unconstrained run's (and Hugging Face's), and every block is free after."""
from __future__ import annotations

import pytest
import torch

from encdec import LLM, SamplingParams
from tests.bart_parity import mixed_prompts, run_parity
from tests.conftest import assert_all_blocks_free
from tests.cuda.helpers import BACKENDS, backend_name


def tight_llm(model_dir, backend, **kwargs) -> LLM:
    """The CPU preemption test's cache, on cuda: 14 blocks of 8 slots for 16 prompts."""
    return LLM(model=str(model_dir), device="cuda", num_gpu_blocks=14, block_size=8,
               swap_space=0.01, attention_backend=backend, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_under_swap_preemption_on_cuda(tiny_bart_dir, backend):
    llm = tight_llm(tiny_bart_dir, backend, preemption_mode="swap")
    assert backend_name(llm) == backend
    cache_engine = llm.llm_engine.cache_engine
    assert all(c.device.type == "cuda" for c in cache_engine.gpu_cache)
    assert all(c.device.type == "cpu" and c.is_pinned() for c in cache_engine.cpu_cache)
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [20 + (7 * i) % 20 for i in range(len(prompts))]
    outputs = run_parity(tiny_bart_dir, llm, prompts, max_tokens)

    stats = llm.llm_engine.stats
    assert stats.num_preemptions > 0
    assert stats.num_swap_outs > 0 and stats.num_swap_ins == stats.num_swap_outs
    assert stats.num_recomputes == 0
    assert stats.num_encoder_runs == len(prompts)  # swapped cross blocks are kept
    assert_all_blocks_free(llm)

    roomy = LLM(model=str(tiny_bart_dir), device="cuda", num_gpu_blocks=256, block_size=8,
                attention_backend=backend)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
    unconstrained = roomy.generate(prompts, params, use_tqdm=False)
    assert roomy.llm_engine.stats.num_preemptions == 0
    differ = [i for i, (a, b) in enumerate(zip(outputs, unconstrained))
              if a.outputs[0].token_ids != b.outputs[0].token_ids]
    assert len(differ) <= 1, f"requests {differ} differ from the unconstrained run"


def test_swap_out_and_in_move_blocks_between_gpu_and_cpu(tiny_bart_dir):
    """CacheEngine.swap_out / swap_in / copy on cuda: every layer's keys and values arrive."""
    llm = tight_llm(tiny_bart_dir, "torch")
    cache_engine = llm.llm_engine.cache_engine
    gen = torch.Generator(device="cuda").manual_seed(0)
    for cache in cache_engine.gpu_cache:
        cache.normal_(generator=gen)
    before = [c.clone() for c in cache_engine.gpu_cache]

    cache_engine.swap_out([(3, 0), (5, 2)])
    for gpu in cache_engine.gpu_cache:
        gpu.zero_()
    cache_engine.swap_in([(0, 7), (2, 1)])
    cache_engine.copy([(7, 9)])

    for gpu, cpu, old in zip(cache_engine.gpu_cache, cache_engine.cpu_cache, before):
        assert torch.equal(cpu[:, 0], old[:, 3].cpu()) and torch.equal(cpu[:, 2], old[:, 5].cpu())
        assert torch.equal(gpu[:, 7], old[:, 3]) and torch.equal(gpu[:, 1], old[:, 5])
        assert torch.equal(gpu[:, 9], old[:, 3])
        assert not gpu[:, [0, 2, 3, 4, 5, 6, 8]].any()
