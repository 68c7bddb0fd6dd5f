"""Whisper test fixtures: espeak-ng speech made at test time, the bundled models, CTranslate2 dirs.

Clips are synthesized once per session (deterministic voices, speeds and texts), resampled to
16 kHz by `encdec.audio.load_audio`, and handed to every system as the same waveform.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.ct2_dirs import ct2_model_dir

from encdec.audio import SAMPLE_RATE, load_audio

# (voice, words per minute, text): eight accents, a few voice variants, 120-190 wpm.
CORPUS = [
    ("en-us", 150, "The quick brown fox jumps over the lazy dog."),
    ("en-gb", 140, "Please send the quarterly report before Friday afternoon."),
    ("en-gb-scotland", 160, "The meeting starts at nine thirty tomorrow morning."),
    ("en-us+f3", 130, "She sells fresh bread at the market every Saturday."),
    ("en-029", 150, "We need more chairs for the conference room."),
    ("en-gb-x-rp", 170, "The train to London leaves from platform four."),
    ("en-us+m3", 180, "Turn left at the next corner and park near the bank."),
    ("en-gb-x-gbclan", 120, "It rained in the city all afternoon."),
    ("en-gb-x-gbcwmd", 150, "My brother plays the guitar in a small band."),
    ("en-us-nyc", 160, "The children are playing football in the park."),
    ("en-us+f2", 140, "Could you open the window, please?"),
    ("en-gb+m2", 190, "The doctor said I should drink more water."),
    ("en-us", 120, "Our flight was delayed because of the storm."),
    ("en-gb", 180, "He bought a new computer for his office last week."),
    ("en-gb-scotland", 130, "The library closes at six in the evening."),
    ("en-us+f4", 160, "I would like a cup of coffee with milk."),
    ("en-029", 180, "The garden is full of red and yellow flowers."),
    ("en-gb-x-rp", 130, "Remember to lock the door when you leave the house."),
    ("en-us+m2", 150, "The price of gas went up again this month."),
    ("en-gb-x-gbclan", 170, "We watched a very funny movie on Sunday night."),
]

LANGUAGE_CLIPS = [
    ("en", "en-us", "The weather is nice today, and we are going to the beach."),
    ("fr", "fr", "Bonjour, je m'appelle Pierre et j'habite à Paris depuis dix ans."),
    ("de", "de", "Guten Morgen, ich wohne seit zehn Jahren in Berlin und arbeite dort."),
    ("es", "es", "Buenos días, me llamo Carlos y vivo en Madrid desde hace diez años."),
]


@dataclass
class Clip:
    text: str
    audio: np.ndarray  # 16 kHz mono float32

    @property
    def pair(self) -> tuple:
        return (self.audio, SAMPLE_RATE)


def speak(folder: Path, name: str, voice: str, speed: int, text: str) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    path = folder / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text],
                   check=True, capture_output=True)
    return load_audio(path)


def normalize(text: str) -> str:
    """WER normalizer: lowercase, punctuation stripped, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).replace("'", "").split())


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    return jiwer.wer([normalize(r) for r in references], [normalize(h) or "<empty>" for h in hypotheses])


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("espeak")


@pytest.fixture(scope="session")
def corpus(speech_dir) -> list[Clip]:
    return [Clip(text, speak(speech_dir, f"clip{i}", voice, speed, text))
            for i, (voice, speed, text) in enumerate(CORPUS)]


@pytest.fixture(scope="session")
def long_clip(corpus) -> Clip:
    """About 100 s: the corpus sentences, then the first six again, 0.4-1.2 s pauses between."""
    rng = np.random.default_rng(0)
    parts, texts = [], []
    for clip in corpus + corpus[:6]:
        parts += [clip.audio, np.zeros(int(rng.uniform(0.4, 1.2) * SAMPLE_RATE), np.float32)]
        texts.append(clip.text)
    return Clip(" ".join(texts), np.concatenate(parts))


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
