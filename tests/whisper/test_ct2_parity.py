"""The bundled Whisper models in the engine: complete loading, and greedy tokens equal to
CTranslate2's (`ctranslate2.models.Whisper.generate`) with the same features and prompt.

Both sides see the same features: the engine computes them from the waveform with its audio
hook (openai-whisper style), CTranslate2 gets `encdec.audio.windows_features(style="whisper")`.
"""
from __future__ import annotations

import math
from operator import attrgetter

import numpy as np
import pytest
import torch

from encdec import SamplingParams
from encdec.audio import windows_features
from encdec.attention.selector import get_attn_backend
from encdec.models.whisper import WhisperForConditionalGeneration
from encdec.models.whisper_ct2 import ct2_whisper_to_hf
from encdec.weights.ct2 import ct2_tensors, open_ct2_model
from tests.conftest import assert_all_blocks_free

ctranslate2 = pytest.importorskip("ctranslate2")

MAX_TOKENS = 96
NEAR_TIE = 2e-3  # CTranslate2 and torch logits differ by ~2e-4 (see notes/whisper-ct2.md)
PROMPTS = {"tiny.en": "<|startoftranscript|><|notimestamps|>",
           "base": "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"}


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_bundled_model_loads_completely(name, request):
    """Every CTranslate2 variable is used, and every engine parameter is filled."""
    assets = request.getfixturevalue(f"{name.replace('.', '_')}_assets")
    llm = request.getfixturevalue(name.replace(".", "_"))
    ct2 = open_ct2_model(assets.bin_parts)
    conversion = ct2_whisper_to_hf(ct2_tensors(ct2), ct2.aliases)
    everything = set(ct2.variables) | set(ct2.aliases)
    assert not conversion.report.unused
    assert conversion.report.used | conversion.report.ignored == everything

    engine_model = llm.llm_engine.model_runner.model
    fresh = WhisperForConditionalGeneration(engine_model.config, get_attn_backend(torch.device("cpu")))
    for param in fresh.parameters():
        param.data.fill_(math.nan)
    fresh.load_weights(conversion.state_dict.items())
    for param_name, param in fresh.named_parameters():
        assert torch.isfinite(param).all(), f"{param_name} was not filled"
        assert torch.equal(param, attrgetter(param_name)(engine_model)), param_name


def test_model_directory_loads_like_the_alias(tiny_en, tiny_en_assets):
    from encdec import LLM

    llm = LLM(model=str(tiny_en_assets.bin_parts[0].parent), num_gpu_blocks=240, swap_space=0.05)
    ours, alias = llm.llm_engine, tiny_en.llm_engine
    assert (ours.model_config.decoder_start_token_id, ours.model_config.eos_token_id) == (50257, 50256)
    assert ours.input_preprocessor.default_decoder_prompt == [50257, 50362]
    fresh = WhisperForConditionalGeneration(ours.model_config.hf_config, get_attn_backend(torch.device("cpu")))
    for name, _ in fresh.named_parameters():  # packed linears included: read by attribute path
        get = attrgetter(name)
        assert torch.equal(get(ours.model_runner.model), get(alias.model_runner.model)), name


# --------------------------------------------------------------------------- greedy parity


def engine_greedy(llm, clips, prompt: str) -> list[list[int]]:
    prompts = [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": clip.pair}},
                "decoder_prompt": prompt} for clip in clips]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                           use_tqdm=False)
    eot = llm.llm_engine.model_config.eos_token_id
    assert_all_blocks_free(llm)
    return [[t for t in out.outputs[0].token_ids if t != eot] for out in outputs]


def ct2_generate(model_dir: str, clips, prompt_ids: list[int], **options):
    model = ctranslate2.models.Whisper(model_dir, device="cpu", compute_type="float32")
    features = windows_features([clip.audio for clip in clips], n_mels=80, style="whisper")
    return model.generate(ctranslate2.StorageView.from_array(features.numpy()),
                          [prompt_ids] * len(clips), beam_size=1, **options)


def compare(name: str, ours: list[list[int]], results) -> float:
    """Agreement rate; every divergence must be a near-tie in CTranslate2's own logits."""
    agree = 0
    for i, (got, result) in enumerate(zip(ours, results)):
        theirs = result.sequences_ids[0]
        if got == theirs:
            agree += 1
            continue
        step = next((s for s, (a, b) in enumerate(zip(got, theirs)) if a != b), min(len(got), len(theirs)))
        logits = np.asarray(result.logits[0][step]) if step < len(result.logits[0]) else None
        ours_token = got[step] if step < len(got) else None
        margin = (float(logits.max() - logits[ours_token])
                  if logits is not None and ours_token is not None else math.inf)
        print(f"{name} clip {i}: differs at step {step} (margin {margin:.2e})")
        assert margin < NEAR_TIE, f"{name} clip {i}: not a near-tie (margin {margin})"
    rate = agree / len(ours)
    print(f"{name}: {agree}/{len(ours)} clips identical to CTranslate2")
    return rate


def run_parity(name, llm, model_dir, clips):
    prompt_ids = llm.get_tokenizer()(PROMPTS[name], add_special_tokens=False)["input_ids"]
    ours = engine_greedy(llm, clips, PROMPTS[name])
    results = ct2_generate(model_dir, clips, prompt_ids, max_length=2 * MAX_TOKENS,
                           suppress_blank=False, suppress_tokens=[], return_logits_vocab=True)
    assert all(len(t) >= 4 for t in ours), "outputs should be real transcripts"
    assert compare(name, ours, results) >= 0.95


def test_tiny_en_greedy_tokens_equal_ctranslate2(tiny_en, tiny_en_assets, ct2_dir, corpus):
    assert len(corpus) >= 20
    run_parity("tiny.en", tiny_en, ct2_dir(tiny_en_assets), corpus)


def test_base_english_greedy_tokens_equal_ctranslate2_few(base, base_assets, ct2_dir, corpus):
    run_parity("base", base, ct2_dir(base_assets), corpus[:2])


@pytest.mark.slow
def test_base_english_greedy_tokens_equal_ctranslate2(base, base_assets, ct2_dir, corpus):
    run_parity("base", base, ct2_dir(base_assets), corpus)
