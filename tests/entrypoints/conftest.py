"""Server test fixtures: speech long enough for two Whisper windows, made with espeak-ng."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from encdec.audio import SAMPLE_RATE
from tests.speech_corpus import CORPUS, speak

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"


@pytest.fixture(scope="session")
def speech_clips(tmp_path_factory) -> list[Path]:
    """Three one-sentence clips (3-4 s each)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("server_speech")
    clips = []
    for i, (voice, speed, text) in enumerate(CORPUS[:3]):
        speak(folder, f"clip{i}", voice, speed, text)
        clips.append(folder / f"clip{i}.wav")
    return clips


@pytest.fixture(scope="session")
def long_wav(tmp_path_factory) -> Path:
    """About 34 s of speech (nine sentences with pauses): two Whisper windows."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("server_long")
    pause = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audio = np.concatenate([part for i, (voice, speed, text) in enumerate(CORPUS[:9])
                            for part in (speak(folder, f"s{i}", voice, speed, text), pause)])
    path = folder / "talk.wav"
    soundfile.write(path, audio, SAMPLE_RATE)
    return path
