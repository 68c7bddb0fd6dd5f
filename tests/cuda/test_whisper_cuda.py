"""Whisper on cuda: greedy tokens equal Hugging Face's on the same GPU (a seeded random-weight
checkpoint of tiny.en's widths, and the bundled tiny.en weights), transcripts equal the CPU
engine's, float16 transcripts stay close to float32's.

The parity tests run cuDNN's convolutions in full float32: by default PyTorch lets them use
TF32, whose rounding (~1e-3) depends on the batch, so the engine and Hugging Face would see
slightly different encoder inputs. `test_default_tf32_transcripts_on_cuda` checks that default.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import WhisperForConditionalGeneration

from encdec import LLM, SamplingParams
from encdec.audio import SAMPLE_RATE, load_audio
from tests.conftest import assert_all_blocks_free
from tests.cuda.helpers import BACKENDS, backend_name
from tests.models.test_whisper_parity import (MAX_TOKENS, PREFIX, PREFIX_TEXT, assert_matches_hf,
                                              assert_varied, hf_greedy_loop,
                                              make_whisper_checkpoint)
from tests.speech_corpus import normalize

SAMPLE = Path(__file__).parents[2] / "samples" / "hello.wav"
SAMPLE_TEXT = "Thank you for calling. Please leave a message after the tone."
TINY_EN_PREFIX_TEXT = "<|startoftranscript|><|notimestamps|>"
TINY_EN_MAX_TOKENS = 64


@pytest.fixture
def exact_float32():
    """cuDNN convolutions in float32 rather than TF32, for this test only."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def engines(tiny_en_assets):
    """tiny.en engines by (device, dtype, backend), made on first use."""
    made = {}

    def get(device: str, dtype: str = "float32", backend=None) -> LLM:
        key = (device, dtype, backend)
        if key not in made:
            made[key] = LLM(model="tiny.en", device=device, dtype=dtype, num_gpu_blocks=20 * 110,
                            swap_space=0.05, attention_backend=backend)
        return made[key]

    return get


def transcribe(llm: LLM, clips) -> list[str]:
    texts = [r.text for r in llm.transcribe([clip.pair for clip in clips], language="en")]
    assert_all_blocks_free(llm)
    return texts


@pytest.fixture(scope="module")
def cpu_texts(engines, speech):
    return transcribe(engines("cpu"), speech)


def whisper_prompts(clips, decoder_prompt: str) -> list[dict]:
    return [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": clip.pair}},
             "decoder_prompt": decoder_prompt} for clip in clips]


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_whisper_parity_on_cuda(tmp_path, speech, backend, exact_float32):
    """tests/models/test_whisper_parity.py's check on cuda: eight clips in one batch."""
    whisper_dir = make_whisper_checkpoint(tmp_path / "whisper")
    hf = WhisperForConditionalGeneration.from_pretrained(str(whisper_dir)).eval().to("cuda")
    llm = LLM(model=str(whisper_dir), device="cuda", num_gpu_blocks=1024, swap_space=0.05,
              attention_backend=backend)
    assert backend_name(llm) == backend
    clips = speech[:8]
    outputs = llm.generate(whisper_prompts(clips, PREFIX_TEXT),
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert all(out.prompt_token_ids == PREFIX for out in outputs)
    expected, logits = hf_greedy_loop(hf, [clip.pair for clip in clips], PREFIX, MAX_TOKENS)
    assert_matches_hf(outputs, expected, logits)
    assert_varied([o.outputs[0].token_ids for o in outputs])
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_en_greedy_tokens_equal_hf_on_cuda(engines, hf_tiny_en, speech, backend,
                                                exact_float32):
    """The bundled tiny.en weights: all corpus clips at once, token for token."""
    llm = engines("cuda", backend=backend)
    assert backend_name(llm) == backend
    outputs = llm.generate(whisper_prompts(speech, TINY_EN_PREFIX_TEXT),
                           SamplingParams(temperature=0.0, max_tokens=TINY_EN_MAX_TOKENS),
                           use_tqdm=False)
    prefix = outputs[0].prompt_token_ids
    assert prefix == [50257, 50362]
    expected, logits = hf_greedy_loop(hf_tiny_en, [clip.pair for clip in speech], prefix,
                                      TINY_EN_MAX_TOKENS)
    assert_matches_hf(outputs, expected, logits)
    assert all(len(o.outputs[0].token_ids) >= 4 for o in outputs), "expected real transcripts"
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_en_transcripts_on_cuda_equal_cpu(engines, speech, cpu_texts, backend,
                                               exact_float32):
    texts = transcribe(engines("cuda", backend=backend), speech)
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(texts, cpu_texts)) if a != b]
    print(f"{backend}: {len(speech) - len(differ)}/{len(speech)} transcripts equal the CPU's")
    assert len(differ) <= 1, differ


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_tf32_transcripts_on_cuda(engines, speech, cpu_texts, backend):
    """PyTorch's default cuDNN settings (TF32 convolutions): the same words as on the CPU."""
    texts = transcribe(engines("cuda", backend=backend), speech)
    same = sum(normalize(a) == normalize(b) for a, b in zip(texts, cpu_texts))
    print(f"{backend}, TF32 convolutions: {same}/{len(speech)} transcripts equal the CPU's")
    assert same >= len(speech) - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_en_float16_transcripts_on_cuda(engines, speech, cpu_texts, backend):
    texts = transcribe(engines("cuda", "float16", backend), speech)
    same = sum(normalize(a) == normalize(b) for a, b in zip(texts, cpu_texts))
    print(f"{backend}, float16: {same}/{len(speech)} transcripts equal float32 on the CPU")
    assert same >= 0.75 * len(speech)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_file_on_cuda(engines, backend):
    """The bundled sample, by path, with timestamps: the words spoken, one window."""
    result = engines("cuda", backend=backend).transcribe(str(SAMPLE))[0]
    assert normalize(result.text) == normalize(SAMPLE_TEXT)
    assert result.duration == pytest.approx(len(load_audio(SAMPLE)) / SAMPLE_RATE)
    assert 0 <= result.segments[0].start < result.segments[-1].end <= result.duration + 1
