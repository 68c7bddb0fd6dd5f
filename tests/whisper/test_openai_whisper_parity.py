"""Transcripts equal to openai-whisper's (`whisper.transcribe`, the reference implementation)
for the bundled tiny.en weights on the espeak-ng corpus: greedy with temperature fallback (its
`transcribe()` defaults), its command line's beam search (beam 5, best_of 5) and patient beams (one beam too);
and on long audio, where the windows follow the decodes as its `seek` does. Each segment's
times, text, tokens (timestamps included), average log-probability, no-speech probability, compression ratio and
temperature."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_all_blocks_free
from tests.openai_whisper_ref import assert_words_equal, openai_whisper_model

whisper = pytest.importorskip("whisper")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return openai_whisper_model("tiny.en", tmp_path_factory.mktemp("openai_whisper"))


def segments_of(result) -> list[tuple]:
    return [(s["start"], s["end"], s["text"].strip(), s["tokens"],
             s["avg_logprob"], s["no_speech_prob"], s["compression_ratio"], s["temperature"])
            for s in result["segments"]]


@pytest.mark.parametrize("options, num_clips", [
    pytest.param({}, 20, id="defaults"), pytest.param({"beam_size": 5, "best_of": 5}, 20, id="beam5"),
    pytest.param({"beam_size": 3, "patience": 2.0}, 10, id="patience2", marks=pytest.mark.extended),
    pytest.param({"beam_size": 1, "patience": 2.0}, 10, id="one-beam-patience2", marks=pytest.mark.extended),
    pytest.param({"beam_size": 3, "length_penalty": 1.0}, 10, id="length_penalty", marks=pytest.mark.extended),
    pytest.param({"initial_prompt": "", "temperature": 0.0}, 4, id="empty-prompt")])
def test_segments_equal_openai_whisper(tiny_en, reference, corpus, options, num_clips):
    """The whole corpus with the defaults and the command line's beams; half of it where one
    beam option changes (openai-whisper's beam search is the slow part)."""
    clips = corpus[:num_clips]
    ours = tiny_en.transcribe([clip.pair for clip in clips], **options)
    for clip, transcript in zip(clips, ours):
        assert_segments_equal(transcript, segments_of(whisper.transcribe(reference, clip.audio, fp16=False, **options)))


@pytest.mark.parametrize("clip, options", [
    pytest.param(2, {"clip_timestamps": "33.3"}, id="86s-from-33.3s", marks=pytest.mark.extended),
    pytest.param(2, {"initial_prompt": "Museum, harvest, bakery.", "temperature": 0.0}, id="86s-prompted"),
    pytest.param(2, {"initial_prompt": "Museum, harvest, bakery.", "temperature": 0.0,
                     "condition_on_previous_text": False}, id="86s-not-conditioned", marks=pytest.mark.extended)])
def test_long_audio_segments_equal_openai_whisper(tiny_en, reference, long_clips, clip, options):
    """Past 30 s (the defaults on the 102 s clip: test_verbose_prints_what_openai_whisper_prints;
    the 86 s clip whole: test_words_equal_openai_whisper), a clip that starts mid-input hears the
    audio before its first frame. Prompted, the third window's prompt fills its 223 tokens and
    its decode runs to the decoder's last position, where the last of its 224 tokens takes
    none. Not conditioned, the windows still follow the decodes, the first alone prompted."""
    audio = long_clips[clip].audio
    (ours,) = tiny_en.transcribe([(audio, 16000)], **options)
    assert_segments_equal(ours, segments_of(whisper.transcribe(reference, audio, fp16=False, **options)))


@pytest.mark.parametrize("max_new_tokens", [1, 6])
def test_max_new_tokens_is_openai_whispers_sample_len(tiny_en, reference, corpus, max_new_tokens):
    """Each window's decode stops after `max_new_tokens` tokens, its timestamps counted, as
    openai-whisper's after `sample_len`. One token is a lone timestamp: each window is one
    segment without text, as there."""
    audio = np.concatenate([clip.audio for clip in corpus[:12]])
    (ours,) = tiny_en.transcribe([(audio, 16000)], max_new_tokens=max_new_tokens)
    assert len(ours.segments) >= 2 and (max_new_tokens > 1 or not ours.text)
    assert_segments_equal(ours, segments_of(whisper.transcribe(reference, audio, fp16=False,
                                                               sample_len=max_new_tokens)))
    assert_all_blocks_free(tiny_en)


def assert_segments_equal(transcript, expected: list[tuple]) -> None:
    """`transcript` read as openai-whisper's result dict is read."""
    got = segments_of(transcript)
    assert [(round(g[0], 2), round(g[1], 2), *g[2:4]) for g in got] == \
        [(round(e[0], 2), round(e[1], 2), *e[2:4]) for e in expected]
    for g, e in zip(got, expected):
        assert g[4:] == pytest.approx(e[4:], abs=1e-3)


def test_an_empty_initial_prompt_is_a_space_as_in_openai_whisper(tiny_en):
    """openai-whisper prompts with " " + initial_prompt.strip() whenever it is not None."""
    from encdec.whisper.prompts import prompt_ids

    tokens = tiny_en.llm_engine.model_config.special_tokens
    expected = whisper.tokenizer.get_tokenizer(False).encode(" ")
    assert prompt_ids(tokens, tiny_en.get_tokenizer(), "", "initial_prompt") == expected == [220]
    assert prompt_ids(tokens, tiny_en.get_tokenizer(), None, "initial_prompt") == []
    spaced = whisper.tokenizer.get_tokenizer(False).encode(" Hello there.")  # its " " + prompt.strip()
    assert prompt_ids(tokens, tiny_en.get_tokenizer(), "  Hello there. \n", "initial_prompt") == spaced


def test_empty_hotwords_are_none_as_in_faster_whisper(tiny_en, corpus):
    """faster-whisper leaves empty hotwords out (an empty initial prompt, by contrast, is a space)."""
    plain, empty = (tiny_en.transcribe(corpus[0].pair, **extra)[0] for extra in ({}, {"hotwords": ""}))
    assert [(s.tokens, s.avg_logprob) for s in empty.segments] == [(s.tokens, s.avg_logprob) for s in plain.segments]


def test_words_equal_openai_whisper(tiny_en, reference, corpus, long_clips):
    """Word timestamps: each word's text, times and probability (its tokens' over the text
    vocabulary, as openai-whisper computes it: at a segment's start the model expects a
    timestamp, which used to halve the first word's). The attention is normalised over every
    token of the alignment pass, <|endoftext|> included, as there; on long audio the next
    window starts at the last word's end unless the decode closed its last segment."""
    audios = [clip.audio for clip in corpus[:4]] + [long_clips[2].audio]
    ours = tiny_en.transcribe([(audio, 16000) for audio in audios], word_timestamps=True)
    for audio, transcript in zip(audios, ours):
        assert_words_equal(transcript, whisper.transcribe(reference, audio, fp16=False, word_timestamps=True))


@pytest.mark.parametrize("word_timestamps", [False, True], ids=["segments", "words"])
def test_a_transcript_reads_as_openai_whisper_s_result_dict(tiny_en, reference, corpus, tmp_path, word_timestamps):
    """Code written for openai-whisper's result dict runs on encdec's transcript: the same keys
    (the transcript has more), "words" in a segment only when its words were timed, the same
    values behind them, and openai-whisper's own writers write the same files from both."""
    audio = corpus[0].audio
    (ours,) = tiny_en.transcribe([(audio, 16000)], word_timestamps=word_timestamps)
    theirs = whisper.transcribe(reference, audio, fp16=False, word_timestamps=word_timestamps)
    assert set(theirs) < set(ours) and all(key in ours for key in theirs)
    assert [set(s) for s in theirs["segments"]] == [set(s) for s in ours["segments"]]
    assert ("words" in ours["segments"][0]) is word_timestamps
    assert (ours["text"], ours["language"]) == (theirs["text"].strip(), theirs["language"])
    assert_segments_equal(ours, segments_of(theirs))
    if word_timestamps:
        assert set(theirs["segments"][0]["words"][0]) < set(dict(ours["segments"][0]["words"][0]))
        assert [w["word"] for s in ours["segments"] for w in s["words"]] == \
            [w["word"] for s in theirs["segments"] for w in s["words"]]
    for kind in ("txt", "vtt", "srt", "tsv"):
        for name, result in (("ours", ours), ("theirs", theirs)):
            (tmp_path / name).mkdir(exist_ok=True)
            whisper.utils.get_writer(kind, str(tmp_path / name))(result, "clip.wav")
        assert (tmp_path / "ours" / f"clip.{kind}").read_text() == (tmp_path / "theirs" / f"clip.{kind}").read_text()
    assert ours.get("no such key") is None and ours.get("duration") == ours.duration
    with pytest.raises(KeyError, match="no such key"):
        ours["no such key"]


def test_a_decode_of_one_segment_starts_at_its_window(tiny_en, reference, long_clips):
    """A decode without a pair of timestamps is one segment from its window's start, whatever
    timestamp opens it, as openai-whisper times it: here the clip's last window (2.2 s before
    its end) opens with <|1.00|>, and its first word is timed from the window's start too."""
    audio = long_clips[0].audio
    options = dict(clip_timestamps="10,40", word_timestamps=True, temperature=0.0)
    (ours,) = tiny_en.transcribe([(audio, 16000)], **options)
    result = whisper.transcribe(reference, audio, fp16=False, **options)
    begin = whisper.tokenizer.get_tokenizer(multilingual=False).timestamp_begin
    assert any(s["tokens"][0] > begin and round(s["start"] * 100) == s["seek"] for s in result["segments"])
    assert_segments_equal(ours, segments_of(result))
    assert_words_equal(ours, result)


def test_pauses_and_noise_equal_openai_whisper(tiny_en, reference, corpus):
    """Speech between long pauses and noise, with word timestamps: a decode that closes its
    last segment early moves on to the window's end, as openai-whisper's seek does (decoding
    the 12 s of noise after "...all afternoon." again made "My brother plays the guitar in a
    small band." "I'm going to go to the place that you tell me that small band.")."""
    audios = [np.concatenate([corpus[6].audio, silence(5), noise(1, 4, 0.03), silence(4), corpus[7].audio,
                              noise(2, 12, 0.01), corpus[8].audio]),
              np.concatenate([corpus[9].audio, silence(20), corpus[10].audio, silence(15), corpus[11].audio])]
    ours = tiny_en.transcribe([(audio, 16000) for audio in audios], word_timestamps=True, temperature=0.0)
    for audio, transcript in zip(audios, ours):
        result = whisper.transcribe(reference, audio, fp16=False, word_timestamps=True, temperature=0.0)
        assert_segments_equal(transcript, segments_of(result))
        assert_words_equal(transcript, result)


def test_a_wordless_decode_the_model_is_sure_of_stays(tiny_en, reference):
    """openai-whisper's no-speech rule alone: 10 s of loud noise decodes to " ." with a
    no-speech probability above 0.6 but an average log-probability above -1, so it stays."""
    audio = np.clip(noise(2, 10, 0.5), -1, 1)
    (ours,) = tiny_en.transcribe([(audio, 16000)], temperature=0.0)
    expected = segments_of(whisper.transcribe(reference, audio, fp16=False, temperature=0.0))
    assert [(s[2], s[5] > 0.6, s[4] > -1) for s in expected] == [(".", True, True)]
    assert_segments_equal(ours, expected)


@pytest.mark.extended
def test_quiet_speech_and_a_noise_floor_equal_openai_whisper(tiny_en, reference, corpus):
    """Speech peaking at -52 dBFS is transcribed (only dither-level windows are passed over);
    30 s of a -55 dBFS noise floor decodes to lone marks (" .", a space first), whose word
    times openai-whisper does not trim as sentence ends. The last seek window is one encoder
    frame (20 ms), where openai-whisper's alignment divides 0 by 0: the empty segments it
    leaves sit at 29.96 s, before that window."""
    quiet = corpus[0].audio * np.float32(10 ** (-52 / 20) / np.abs(corpus[0].audio).max())
    floor = noise(3, 30, 10 ** (-55 / 20))
    ours = tiny_en.transcribe([(quiet, 16000), (floor, 16000)], word_timestamps=True, temperature=0.0)
    for audio, transcript in zip((quiet, floor), ours):
        result = whisper.transcribe(reference, audio, fp16=False, word_timestamps=True, temperature=0.0)
        assert_segments_equal(transcript, segments_of(result))
        assert_words_equal(transcript, result)
    assert ours[0].text and any(w.word == " ." for s in ours[1].segments for w in s.words)


@pytest.mark.extended
def test_hallucination_silence_threshold_equals_openai_whisper(tiny_en, reference, corpus):
    """`hallucination_silence_threshold` by openai-whisper's rules, on speech after murmur and
    noise that tiny.en turns into words: the silence before a first segment that looks like a
    hallucination is skipped (the first two inputs), a window whose last word leaves no more than
    the threshold of its 30 s moves on to its end (the second), and a hallucination between
    silences goes with the rest of its window, decoded again from it (the third). A window
    shorter than 30 s still counts 30 s: the 0.53 s left after "...platform 4." (a clip's first
    0.39 s) is decoded again, to a first segment that looks like a hallucination, kept as it
    starts 0.18 s into its window, the gap timed from the window's start (the fourth); a
    hallucination ending less than the threshold before the input's end ends the input, not
    decoded again (the fifth: a clip's first 0.87 s, 25 s after speech, up to 28.78 s)."""
    audios = [np.concatenate([murmur(3, 3.75, 0.42), corpus[10].audio, noise(4, 7, 0.021), murmur(5, 9.4, 0.3),
                              corpus[17].audio, corpus[10].audio]),
              np.concatenate([murmur(6, 7.1, 0.095), noise(7, 10.4, 0.049), murmur(8, 9.4, 0.49), silence(2.8),
                              corpus[19].audio]),
              np.concatenate([corpus[5].audio, murmur(2, 5.88, 0.406), murmur(3, 7.93, 0.071), silence(7.42),
                              corpus[17].audio]),
              np.concatenate([noise(37, 3.63, 0.018), silence(6.7), corpus[5].audio, silence(0.78),
                              corpus[2].audio[:round(0.39 * 16000)]]),
              np.concatenate([corpus[8].audio, silence(25.02), corpus[1].audio[:round(0.87 * 16000)]])]
    options = dict(word_timestamps=True, hallucination_silence_threshold=2.0, temperature=0.0)
    ours = tiny_en.transcribe([(audio, 16000) for audio in audios], **options)
    for audio, transcript in zip(audios, ours):
        result = whisper.transcribe(reference, audio, fp16=False, **options)
        assert_segments_equal(transcript, segments_of(result))
        assert_words_equal(transcript, result)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * 16000), np.float32)


def noise(seed: int, seconds: float, level: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, level, round(seconds * 16000)).astype(np.float32)


def murmur(seed: int, seconds: float, level: float) -> np.ndarray:
    """Noise low-passed to a murmur (a 40-sample moving average)."""
    return np.convolve(noise(seed, seconds, level), np.ones(40) / 40, "same").astype(np.float32)


def test_verbose_prints_what_openai_whisper_prints(tiny_en, reference, long_clips, capsys):
    """A 102 s clip with the defaults, `verbose=True` (and `fp16=False`, as openai-whisper users
    pass on a CPU): the same segments, conditioned (each window starts where the last decode
    left off, its features cut from one log-mel of the whole input, as in openai-whisper), and
    the same lines on stdout, a window's segments at a time."""
    audio = long_clips[1].audio
    result = whisper.transcribe(reference, audio, fp16=False, verbose=True)
    expected = capsys.readouterr().out
    assert expected.count("\n") > 5
    (ours,) = tiny_en.transcribe([(audio, 16000)], fp16=False, verbose=True)
    assert capsys.readouterr().out == expected
    assert_segments_equal(ours, segments_of(result))
