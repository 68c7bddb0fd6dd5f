"""Deterministic speech made with espeak-ng (an English corpus, a few other languages), and
the WER used to score transcripts of it.

Shared by the Whisper tests and `benchmarks/bench_whisper.py` (which runs without pytest).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
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

LONG_SENTENCES = [
    "The museum opens its new exhibition next Tuesday.",
    "Farmers in the valley expect a good harvest this year.",
    "Please turn off your phone during the performance.",
    "The bridge was closed for repairs for three months.",
    "Our neighbours adopted a small grey cat last spring.",
    "The bakery on the corner sells the best apple pie.",
    "Students must hand in their essays by Monday noon.",
    "A strong wind blew the leaves across the empty street.",
    "The hotel offers free breakfast to all its guests.",
    "He forgot his umbrella at the bus stop again.",
    "The river flooded the fields after a week of rain.",
    "My sister is learning to play the piano.",
    "The new restaurant downtown serves fresh fish every day.",
    "We planted tomatoes and beans in the back garden.",
    "The bus was late, so we walked to the station.",
    "Her grandmother tells wonderful stories about the old days.",
    "The team celebrated their victory with a big dinner.",
    "Please write your name at the top of the page.",
    "The mountains were covered in snow until early June.",
    "I left my keys on the kitchen table this morning.",
    "The company will hire twenty new engineers next year.",
    "A small boat sailed slowly across the quiet lake.",
    "The teacher asked the students to read the first chapter.",
    "We stayed in a little cabin near the forest.",
    "The baby finally fell asleep after a long walk.",
    "The shop closes early on public holidays.",
    "He repaired the old bicycle with his father.",
    "The concert was cancelled because the singer was ill.",
    "They painted the kitchen a bright shade of blue.",
    "The dog barked loudly when the postman arrived.",
    "I usually drink tea before I go to bed.",
    "The city council approved the plan for a new park.",
    "Most of the guests arrived after eight o'clock.",
    "The pilot announced that we would land in twenty minutes.",
    "She found an old photograph inside the book.",
    "The children built a snowman in the front yard.",
    "Fresh vegetables are cheaper at the farmers market.",
    "The printer on the second floor is out of paper.",
    "We should leave now if we want to catch the train.",
    "The nurse checked his temperature every four hours.",
]

# Voices the long clips cycle through for LONG_SENTENCES.
LONG_VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-029", "en-gb-x-rp", "en-us+m3",
               "en-us-nyc", "en-us+f2", "en-gb+m2", "en-us+f4"]

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


@dataclass
class LongClip:
    """A long clip and the sentences spoken in it, in order."""

    name: str
    audio: np.ndarray  # 16 kHz mono float32
    sentences: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def seconds(self) -> float:
        return len(self.audio) / 16000


def long_clips(folder: Path) -> list[LongClip]:
    """Three long clips (about 7 minutes in all) from CORPUS and LONG_SENTENCES:

    * "pauses": 50 sentences with 0.3-0.9 s pauses, about 3 minutes;
    * "tight": 31 sentences with 0.1 s pauses, so cuts fall in short gaps;
    * "run-on": 30 sentences joined by "and" in tens of seconds-long utterances, so sentences
      run across the 30 s boundaries and cuts fall between words.
    """
    spoken = [*CORPUS, *[(LONG_VOICES[i % len(LONG_VOICES)], 130 + 10 * (i % 6), text)
                         for i, text in enumerate(LONG_SENTENCES)]]
    audio = [speak(folder, f"long{i}", voice, speed, text) for i, (voice, speed, text) in enumerate(spoken)]
    texts = [text for _, _, text in spoken]
    rng = np.random.default_rng(0)

    def joined(indices: list[int], pause) -> np.ndarray:
        return np.concatenate([part for i in indices
                               for part in (audio[i], np.zeros(int(pause() * 16000), np.float32))])

    pauses = list(range(50))
    tight = list(range(29, 60))
    clips = [LongClip("pauses", joined(pauses, lambda: rng.uniform(0.3, 0.9)), [texts[i] for i in pauses]),
             LongClip("tight", joined(tight, lambda: 0.1), [texts[i] for i in tight])]
    runs, run_audio = [], []
    for k, start in enumerate(range(10, 40, 3)):
        run = " and ".join(t.rstrip(".?!") if j == 0 else t[0].lower() + t[1:].rstrip(".?!")
                           for j, t in enumerate(texts[start:start + 3])) + "."
        voice, speed, _ = spoken[start]
        runs.append(run)
        run_audio += [speak(folder, f"run{k}", voice, speed, run), np.zeros(1600, np.float32)]
    clips.append(LongClip("run-on", np.concatenate(run_audio), runs))
    return clips


def normalize(text: str) -> str:
    """WER normalizer: lowercase, punctuation stripped, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).replace("'", "").split())


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    return jiwer.wer([normalize(r) for r in references], [normalize(h) or "<empty>" for h in hypotheses])


def sentence_coverage(sentences: list[str], hypothesis: str) -> list[float]:
    """For each reference sentence, the share of its words the hypothesis transcribed (matched
    or misheard, not deleted) when the whole hypothesis is aligned to the joined sentences; a
    dropped sentence scores about 0."""
    import jiwer

    words = [normalize(s).split() for s in sentences]
    owner = [i for i, w in enumerate(words) for _ in w]
    heard = [0] * len(sentences)
    alignment = jiwer.process_words(" ".join(" ".join(w) for w in words), normalize(hypothesis) or "<empty>")
    for chunk in alignment.alignments[0]:
        if chunk.type in ("equal", "substitute"):
            for k in range(chunk.ref_start_idx, chunk.ref_end_idx):
                heard[owner[k]] += 1
    return [h / max(1, len(w)) for h, w in zip(heard, words)]
