"""faster-whisper's `repetition_penalty` and `no_repeat_ngram_size` on a long input whose windows
are prompted with the text before them: the same text as faster-whisper's `WhisperModel` with
the same settings (they count a decode's own tokens, not its prompt), greedy and with beams.
vLLM's presence and frequency penalties, and its limits on the sampled decodes."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import wer

faster_whisper = pytest.importorskip("faster_whisper")

SETTINGS = [dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=3, beam_size=5)]


@pytest.fixture(scope="module")
def long_audio(corpus) -> np.ndarray:
    """Most of the corpus read one clip after another with short pauses: two windows, the second
    prompted with the first's text."""
    pause = np.zeros(4000, dtype=np.float32)
    return np.concatenate([part for clip in corpus[:14] for part in (clip.audio, pause)])


def test_penalties_decode_as_faster_whisper(tiny_en, tiny_en_assets, long_audio):
    model = faster_whisper.WhisperModel(str(tiny_en_assets.bin_parts[0].parent), device="cpu",
                                        compute_type="float32")

    def texts(**settings) -> tuple[str, str]:
        settings = {"beam_size": 1, **settings}
        theirs = " ".join(s.text.strip() for s in model.transcribe(long_audio, language="en", **settings)[0])
        ours = tiny_en.transcribe([(long_audio, 16000)], language="en", **settings)[0]
        assert ours.segments[-1].start > 30  # a second window, prompted
        return theirs, " ".join(s.text.strip() for s in ours.segments)

    plain = texts()[1]
    for settings in SETTINGS:
        theirs, ours = texts(**settings)
        assert wer([theirs], [ours]) <= 0.01, settings
        assert wer([plain], [ours]) >= 0.03, settings  # the penalties change the text
    # vLLM's, which faster-whisper lacks, over the same tokens
    ours = tiny_en.transcribe([(long_audio, 16000)], language="en", presence_penalty=1.0, frequency_penalty=0.5)
    assert wer([plain], [ours[0].text]) >= 0.03
    assert_all_blocks_free(tiny_en)


@pytest.mark.parametrize("limit", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_sampling_limits_that_keep_one_token_sample_the_greedy_text(tiny_en, corpus, limit):
    """vLLM's top_k, top_p and min_p limit the sampled decodes: kept to the likeliest token,
    five samples at temperature 1 are the greedy decode."""
    audio = [clip.pair for clip in corpus[:2]]
    greedy = [t.text for t in tiny_en.transcribe(audio, language="en", temperature=0.0)]
    sampled = [t.text for t in tiny_en.transcribe(audio, language="en", temperature=1.0, best_of=5, **limit)]
    free = [t.text for t in tiny_en.transcribe(audio, language="en", temperature=1.0, best_of=5)]
    assert sampled == greedy and free != greedy
    assert_all_blocks_free(tiny_en)

