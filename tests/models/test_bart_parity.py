"""Greedy BART through the engine equals Hugging Face `generate()` token for token.

The torch attention backend is selected explicitly (it is also what the selector picks on CPU).
"""
from __future__ import annotations

import pytest
from encdec import LLM
from tests.bart_checkpoints import BART_BASE, DEEP_INIT_STDS, make_bart_checkpoint
from tests.bart_parity import EOS, assert_varied, mixed_prompts, run_parity
from tests.conftest import assert_all_blocks_free


def test_tiny_bart_parity_mixed_prompts(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=256, attention_backend="torch")
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
    llm = LLM(model=str(model_dir), num_gpu_blocks=256, attention_backend="torch")
    prompts = mixed_prompts(llm.get_tokenizer())
    outputs = run_parity(model_dir, llm, prompts, [24] * len(prompts))
    reasons = {o.outputs[0].finish_reason for o in outputs}
    assert reasons == {"stop", "length"}, reasons
    for o in outputs:
        if o.outputs[0].finish_reason == "stop":
            assert o.outputs[0].token_ids[-1] == EOS
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("weights_format, expected_file", [
    ("bin", "pytorch_model.bin"), ("sharded", "model.safetensors.index.json")])
def test_other_checkpoint_layouts_load(tmp_path, weights_format, expected_file):
    model_dir = make_bart_checkpoint(tmp_path / weights_format, seed=2, weights_format=weights_format)
    assert (model_dir / expected_file).exists()
    llm = LLM(model=str(model_dir), num_gpu_blocks=128, attention_backend="torch")
    prompts = mixed_prompts(llm.get_tokenizer(), count=4)
    run_parity(model_dir, llm, prompts, [12] * 4)


def test_untied_embeddings_load_separately(tmp_path):
    """tie_word_embeddings=False: encoder, decoder and LM head each keep their own matrix."""
    model_dir = make_bart_checkpoint(tmp_path / "untied", seed=5, tie_word_embeddings=False)
    llm = LLM(model=str(model_dir), num_gpu_blocks=128, attention_backend="torch")
    model = llm.llm_engine.model_runner.model.model
    assert model.encoder.embed_tokens is not model.decoder.embed_tokens
    prompts = mixed_prompts(llm.get_tokenizer(), count=8)
    assert_varied(run_parity(model_dir, llm, prompts, [18] * 8))
    assert_all_blocks_free(llm)


def test_bart_base_config_reduced_layers(tmp_path):
    """facebook/bart-base widths and vocabulary, two layers per side, 16 prompts."""
    model_dir = make_bart_checkpoint(tmp_path / "base2", seed=3, init_std=0.1,
                                     **dict(BART_BASE, encoder_layers=2, decoder_layers=2))
    llm = LLM(model=str(model_dir), num_gpu_blocks=256, attention_backend="torch")
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [6 + (5 * i) % 20 for i in range(len(prompts))]
    assert_varied(run_parity(model_dir, llm, prompts, max_tokens))
    assert_all_blocks_free(llm)


@pytest.mark.slow
def test_bart_base_full_shape(tmp_path):
    """facebook/bart-base, all 6+6 layers, with DEEP_INIT_STDS so outputs vary."""
    model_dir = make_bart_checkpoint(tmp_path / "base", seed=4, init_stds=DEEP_INIT_STDS, **BART_BASE)
    llm = LLM(model=str(model_dir), num_gpu_blocks=512, attention_backend="torch")
    prompts = mixed_prompts(llm.get_tokenizer())
    max_tokens = [16 + (9 * i) % 48 for i in range(len(prompts))]
    assert_varied(run_parity(model_dir, llm, prompts, max_tokens))
    assert_all_blocks_free(llm)
