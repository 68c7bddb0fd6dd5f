"""Greedy BART through the engine equals Hugging Face `generate()` token for token."""
from __future__ import annotations

import pytest
from transformers import BartForConditionalGeneration

from encdec import LLM, SamplingParams, TextPrompt, TokensPrompt
from tests.bart_checkpoints import BART_BASE, CORPUS, make_bart_checkpoint
from tests.conftest import assert_all_blocks_free
from tests.hf_reference import NEAR_TIE, divergence_margin, hf_greedy

EOS = 2


def mixed_prompts(tokenizer, count: int = 16) -> list:
    """`count` prompts of different lengths cycling through all four prompt forms."""
    prompts = []
    for i in range(count):
        text = " ".join(CORPUS[j % len(CORPUS)] for j in range(i, i + 1 + i % 4))
        ids = tokenizer(text)["input_ids"]
        form = i % 4
        if form == 0:
            prompts.append(text)
        elif form == 1:
            prompts.append(TextPrompt(prompt=text))
        elif form == 2:
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        else:
            decoder = [None, "The summary", [0, 100 + i], [2, 0, 50 + i]][(i // 4) % 4]
            prompts.append({"encoder_prompt": TokensPrompt(prompt_token_ids=ids),
                            "decoder_prompt": decoder})
    return prompts


def run_parity(model_dir, llm: LLM, prompts, max_tokens: list[int]):
    """Run the engine on all prompts in one batch and compare each with HF; return outputs."""
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    hf = BartForConditionalGeneration.from_pretrained(str(model_dir)).eval()
    ties = []
    for i, out in enumerate(outputs):
        enc, dec, got = out.encoder_prompt_token_ids, out.prompt_token_ids, out.outputs[0].token_ids
        expected = hf_greedy(hf, enc, dec, max_tokens[i], EOS)
        if got != expected:
            margin = divergence_margin(hf, enc, dec, got, expected)
            assert margin < NEAR_TIE, f"prompt {i} differs from Hugging Face (logit margin {margin})"
            ties.append((i, margin))
    assert len(ties) <= 1, f"too many near-tie divergences: {ties}"
    return outputs


def assert_varied(outputs):
    """Random weights must still give varied, long outputs, or parity proves little."""
    seqs = [tuple(o.outputs[0].token_ids) for o in outputs]
    assert len(set(seqs)) >= len(seqs) // 2, "outputs are nearly all identical"
    assert sum(len(set(s)) > 1 for s in seqs) >= len(seqs) // 2, "outputs repeat one token"
    assert max(len(s) for s in seqs) >= 16


def test_tiny_bart_parity_mixed_prompts(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=256)
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [8 + (7 * i) % 25 for i in range(len(prompts))]
    outputs = run_parity(tiny_bart_dir, llm, prompts, max_tokens)
    assert_varied(outputs)
    assert_all_blocks_free(llm)
    # The <DEC> rule: decoder prompts always start with decoder_start_token_id.
    assert all(o.prompt_token_ids[0] == EOS for o in outputs)
    assert outputs[0].prompt_token_ids == [2, 0]
    assert outputs[15].prompt_token_ids == [2, 0, 65]
    assert outputs[11].prompt_token_ids == [2, 0, 111]
    summary_ids = llm.get_tokenizer()("The summary", add_special_tokens=False)["input_ids"]
    assert outputs[7].prompt_token_ids == [2] + summary_ids


def test_eos_stops_like_hugging_face(tmp_path):
    """A checkpoint biased toward EOS: some requests stop early with finish_reason 'stop'."""
    model_dir = make_bart_checkpoint(tmp_path / "eos", seed=1, eos_logit_bias=9.0)
    llm = LLM(model=str(model_dir), num_gpu_blocks=256)
    prompts = mixed_prompts(llm.get_tokenizer())
    outputs = run_parity(model_dir, llm, prompts, [24] * len(prompts))
    reasons = {o.outputs[0].finish_reason for o in outputs}
    assert reasons == {"stop", "length"}, reasons
    for o in outputs:
        if o.outputs[0].finish_reason == "stop":
            assert o.outputs[0].token_ids[-1] == EOS
    assert_all_blocks_free(llm)


def test_pytorch_bin_checkpoint_loads(tmp_path):
    model_dir = make_bart_checkpoint(tmp_path / "bin", seed=2, safe_serialization=False)
    assert (model_dir / "pytorch_model.bin").exists()
    llm = LLM(model=str(model_dir), num_gpu_blocks=128)
    prompts = mixed_prompts(llm.get_tokenizer(), count=4)
    run_parity(model_dir, llm, prompts, [12] * 4)


def test_bart_base_config_reduced_layers(tmp_path):
    """facebook/bart-base widths and vocabulary, two layers per side, 16 prompts."""
    model_dir = make_bart_checkpoint(tmp_path / "base2", seed=3, init_std=0.1,
                                     **dict(BART_BASE, encoder_layers=2, decoder_layers=2))
    llm = LLM(model=str(model_dir), num_gpu_blocks=256)
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [6 + (5 * i) % 20 for i in range(len(prompts))]
    assert_varied(run_parity(model_dir, llm, prompts, max_tokens))
    assert_all_blocks_free(llm)


@pytest.mark.slow
def test_bart_base_full_shape(tmp_path):
    model_dir = make_bart_checkpoint(tmp_path / "base", seed=4, init_std=0.1, **BART_BASE)
    llm = LLM(model=str(model_dir), num_gpu_blocks=512)
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [16 + (9 * i) % 48 for i in range(len(prompts))]
    assert_varied(run_parity(model_dir, llm, prompts, max_tokens))
    assert_all_blocks_free(llm)
