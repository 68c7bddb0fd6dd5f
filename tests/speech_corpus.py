"""Deterministic speech made with espeak-ng (an English corpus, a few other languages), and
the WER used to score transcripts of it.

Shared by the Whisper tests and `benchmarks/bench_whisper.py` (which runs without pytest).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from encdec.audio import load_audio

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



def speak(folder: Path, name: str, voice: str, speed: int, text: str) -> np.ndarray:
    """`text` spoken by espeak-ng's `voice` at `speed` words per minute, as 16 kHz audio
    (the .wav stays in `folder`)."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (Debian: apt-get install espeak-ng sox)")
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
