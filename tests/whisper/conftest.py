"""Whisper test fixtures: espeak-ng speech made at test time, the bundled models, CTranslate2 dirs.

Clips are synthesized once per session (deterministic voices, speeds and texts), resampled to
16 kHz by `encdec.audio.load_audio`, and handed to every system as the same waveform.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.ct2_dirs import ct2_model_dir
from tests.speech_corpus import CORPUS, LANGUAGE_CLIPS, LongClip, speak
from tests.speech_corpus import long_clips as make_long_clips

from encdec.audio import SAMPLE_RATE


@dataclass
class Clip:
    text: str
    audio: np.ndarray  # 16 kHz mono float32

    @property
    def pair(self) -> tuple:
        return (self.audio, SAMPLE_RATE)


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    return tmp_path_factory.mktemp("espeak")


@pytest.fixture(scope="session")
def corpus(speech_dir) -> list[Clip]:
    return [Clip(text, speak(speech_dir, f"clip{i}", voice, speed, text))
            for i, (voice, speed, text) in enumerate(CORPUS)]


@pytest.fixture(scope="session")
def long_clips(speech_dir) -> list[LongClip]:
    return make_long_clips(speech_dir)


@pytest.fixture(scope="session")
def language_clips(speech_dir) -> list[tuple[str, Clip]]:
    return [(lang, Clip(text, speak(speech_dir, f"lang_{lang}", voice, 150, text)))
            for lang, voice, text in LANGUAGE_CLIPS]


def _bundled(name: str):
    from encdec.weights.whisper_assets import resolve_whisper_model

    try:
        return resolve_whisper_model(name)
    except ValueError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def tiny_en_assets():
    return _bundled("tiny.en")


@pytest.fixture(scope="session")
def base_assets():
    return _bundled("base")


def make_llm(model: str, num_gpu_blocks: int):
    from encdec import LLM

    return LLM(model=model, num_gpu_blocks=num_gpu_blocks, swap_space=0.05)


@pytest.fixture(scope="session")
def tiny_en(tiny_en_assets):
    """tiny.en with room for 20 windows at once (109 blocks of 16 slots each)."""
    return make_llm("tiny.en", 20 * 110)


@pytest.fixture(scope="session")
def base(base_assets):
    return make_llm("base", 6 * 110)


@pytest.fixture(scope="session")
def ct2_dir(tmp_path_factory):
    """`name -> directory` CTranslate2 can open: split parts joined into one model.bin."""
    made = {}

    def get(assets) -> str:
        if assets.name not in made:
            made[assets.name] = str(ct2_model_dir(
                assets, lambda: tmp_path_factory.mktemp("ct2_" + assets.name)))
        return made[assets.name]

    return get
