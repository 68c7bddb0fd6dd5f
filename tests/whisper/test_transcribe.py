"""`LLM.transcribe` with the bundled tiny.en against faster-whisper on espeak-ng speech.

The corpus is transcribed once, all clips in one call (one continuous batch); faster-whisper
(`beam_size=1`, float32, otherwise its defaults) gets the same 16 kHz waveforms.
"""
from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from encdec import SamplingParams
from encdec.audio import SAMPLE_RATE
from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import wer

faster_whisper = pytest.importorskip("faster_whisper")


@pytest.fixture(scope="module")
def together(tiny_en, corpus):
    """Every corpus clip in one call, with the progress reports it made."""
    progress: list[float] = []
    results = tiny_en.transcribe([clip.pair for clip in corpus], on_progress=progress.append)
    return results, progress


@pytest.fixture(scope="module")
def reference_model(tiny_en_assets):
    return faster_whisper.WhisperModel(str(tiny_en_assets.bin_parts[0].parent), device="cpu",
                                       compute_type="float32")


@pytest.fixture(scope="module")
def reference(reference_model, corpus):
    return [list(reference_model.transcribe(clip.audio, beam_size=1)[0]) for clip in corpus]


def fw_text(segments) -> str:
    return "".join(s.text for s in segments).strip()


def test_wer_within_one_point_of_faster_whisper(together, reference, corpus):
    results, _ = together
    texts = [clip.text for clip in corpus]
    ours, theirs = wer(texts, [r.text for r in results]), wer(texts, [fw_text(s) for s in reference])
    same = sum(r.text == fw_text(s) for r, s in zip(results, reference))
    print(f"tiny.en WER on {len(corpus)} clips: encdec {ours:.2%}, faster-whisper {theirs:.2%}; "
          f"identical text on {same}/{len(corpus)}")
    assert abs(ours - theirs) <= 0.01


def test_segments_match_faster_whisper(together, reference, corpus, tiny_en):
    results, _ = together
    same = 0
    for clip, result, segments in zip(corpus, results, reference):
        expected = [(s.start, s.end, s.tokens) for s in segments]
        same += [(s.start, s.end, s.tokens) for s in result.segments] == \
            [(pytest.approx(a, abs=1e-6), pytest.approx(b, abs=1e-6), c) for a, b, c in expected]
        assert result.language == "en" and result.source is None
        assert result.duration == pytest.approx(len(clip.audio) / SAMPLE_RATE)
    print(f"segments (times, tokens) identical to faster-whisper on {same}/{len(corpus)} clips")
    assert same >= 0.9 * len(corpus)


def test_progress_reports_every_window(together, corpus):
    _, progress = together
    total = sum(len(clip.audio) for clip in corpus) / SAMPLE_RATE
    assert len(progress) == len(corpus)
    assert all(b > a for a, b in zip(progress, progress[1:]))
    assert progress[-1] == pytest.approx(total)


def test_batched_transcripts_equal_alone(tiny_en, together, corpus):
    """The same bits batched or alone: tokens, times, and each segment's avg_logprob,
    no_speech_prob and compression ratio (a lone row's linears and log-normalizer once
    summed in another order)."""
    results, _ = together
    for clip, batched in list(zip(corpus, results))[:16]:
        alone = tiny_en.transcribe(clip.pair)[0]
        assert alone.text == batched.text
        assert alone.segments == batched.segments
    assert_all_blocks_free(tiny_en)


def test_silence_gives_an_empty_transcript(tiny_en):
    """Digital silence is not decoded. (Faint noise is, at every temperature down the fallback:
    whether it ends as dots or as nothing is down to the samples drawn, for openai-whisper too.)"""
    inputs = [np.zeros(5 * SAMPLE_RATE), np.zeros(35 * SAMPLE_RATE), np.full(8 * SAMPLE_RATE, 1e-6)]
    results = tiny_en.transcribe([(audio.astype(np.float32), SAMPLE_RATE) for audio in inputs])
    for audio, result in zip(inputs, results):
        assert (result.text, result.segments) == ("", [])
        assert result.duration == pytest.approx(len(audio) / SAMPLE_RATE)
    assert_all_blocks_free(tiny_en)


def test_file_input_initial_prompt_and_no_timestamps(tiny_en, corpus, speech_dir):
    path = speech_dir / "clip0.wav"
    (result,) = tiny_en.transcribe(str(path), timestamps=False, initial_prompt="A pangram.")
    assert result.source == str(path)
    assert len(result.segments) == 1 and result.segments[0].start == 0.0
    # to the last whole 10 ms frame, as openai-whisper's segment ends
    assert result.segments[0].end == pytest.approx(round(result.duration * SAMPLE_RATE) // 160 / 100)
    assert wer([corpus[0].text], [result.text]) <= 0.4


def test_an_initial_prompt_of_token_ids(tiny_en, corpus):
    """faster-whisper's `initial_prompt` as token ids: used as they are (the text's ids give the
    text's transcript); an id that is not a text token is refused."""
    text = "Museum, harvest, bakery."
    ids = tiny_en.get_tokenizer()(" " + text, add_special_tokens=False)["input_ids"]
    clip = corpus[1].pair
    (by_text,), (by_ids,) = tiny_en.transcribe(clip, initial_prompt=text), tiny_en.transcribe(clip, initial_prompt=ids)
    assert [(s.text, s.tokens) for s in by_ids.segments] == [(s.text, s.tokens) for s in by_text.segments]
    with pytest.raises(ValueError, match="initial_prompt contains token id 50256, not a text token"):
        tiny_en.transcribe(clip, initial_prompt=[*ids, 50256])
    assert_all_blocks_free(tiny_en)


def test_startofprev_prompt_is_not_given_a_leading_sot(tiny_en, corpus):
    tokenizer = tiny_en.get_tokenizer()
    ids = tokenizer("<|startofprev|> A pangram.<|startoftranscript|><|notimestamps|>",
                    add_special_tokens=False)["input_ids"]
    (out,) = tiny_en.generate([{"encoder_prompt": {"prompt": "", "multi_modal_data": {
        "audio": corpus[0].pair}}, "decoder_prompt": {"prompt_token_ids": ids}}],
        SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert out.prompt_token_ids == ids and ids[0] == tokenizer.convert_tokens_to_ids("<|startofprev|>")


def test_vllms_whisper_prompt_starts_the_decoder_with_its_text(tiny_en, corpus):
    """`{"prompt": text, "multi_modal_data": audio}`: the audio to the encoder, the text (or token
    ids) to the decoder, as vLLM reads it; an explicit encoder prompt with audio takes no text."""
    audio, start = {"audio": corpus[0].pair}, "<|startoftranscript|><|notimestamps|>"
    ids = tiny_en.get_tokenizer()(start, add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    explicit, by_text, by_ids = tiny_en.generate(
        [{"encoder_prompt": {"prompt": "", "multi_modal_data": audio}, "decoder_prompt": start},
         {"prompt": start, "multi_modal_data": audio}, {"prompt_token_ids": ids, "multi_modal_data": audio}],
        greedy, use_tqdm=False)
    assert explicit.prompt_token_ids == by_text.prompt_token_ids == by_ids.prompt_token_ids == ids
    assert explicit.outputs[0].token_ids == by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    for prompt, message in (({"encoder_prompt": {"prompt": start, "multi_modal_data": audio}},
                             "encoder_prompt with multi_modal_data takes no text or token ids"),
                            ({"prompt": start, "multi_modal_data": 5},
                             r"^prompt 0: prompt\['multi_modal_data'\] must be a dict"),
                            ({"prompt": "", "multi_modal_data": [[1]]}, r"must be a dict such as")):
        with pytest.raises(ValueError, match=message):
            tiny_en.generate(prompt, greedy, use_tqdm=False)
    assert_all_blocks_free(tiny_en)


def test_option_errors(tiny_en, corpus):
    clip = corpus[0].pair
    with pytest.raises(ValueError, match="English-only.*language"):
        tiny_en.transcribe(clip, language="fr")
    with pytest.raises(ValueError, match="English-only.*translate"):
        tiny_en.transcribe(clip, task="translate")
    with pytest.raises(ValueError, match="task must be"):
        tiny_en.transcribe(clip, task="summarize")
    # openai-whisper's special tokens, those Hugging Face's tokenizer reads as text too
    for prompt in ("Call me <|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>", "at <|0.00|>",
                   "<|30.00|> on", "<|nospeech|>"):
        with pytest.raises(ValueError, match=r"initial_prompt contains '<\|.*\|>', the text of a special token"):
            tiny_en.transcribe(clip, initial_prompt=prompt)
    assert tiny_en.transcribe([clip], initial_prompt="<|0.01|> and <|31.00|>")[0].text  # no token of either
    with pytest.raises(ValueError, match="input 1"):
        tiny_en.transcribe([clip, 3])
    assert tiny_en.transcribe([]) == []
    assert_all_blocks_free(tiny_en)


@pytest.mark.parametrize("options, message", [
    (dict(suppress_tokens=[10**8]), "suppress_tokens: 100000000 is neither -1 nor a token id"),
    (dict(suppress_tokens="-2"), "suppress_tokens: -2"),
    (dict(beam_size=300), r"beam_size=300 is more than the engine runs at once \(max_num_seqs=256\)"),
    (dict(best_of=300, temperature=0.5), "best_of=300"),
    (dict(clip_timestamps="1,inf"), "clip_timestamps"),
    (dict(compression_ratio_threshold=float("nan")), "compression_ratio_threshold"),
    (dict(suppress_tokens=list(range(51864)), temperature=0.0),
     r"suppress_tokens may not name <\|endoftext\|> \(50256\)"),
    (dict(suppress_tokens=list(range(50256))), "suppress_tokens suppresses every text token"),
    (dict(vad_filter=True, vad_parameters={"max_speech_duration_s": 0.001}),
     "max_speech_duration_s must be a number >= 0.064"),
    (dict(initial_prompt=5), "initial_prompt must be a string"),
    (dict(temperature="0.5"), "temperature must be"),
    # faster-whisper's spellings of what encdec names otherwise, and one it does not take
    (dict(log_prob_threshold=-1.0), "unknown transcribe option 'log_prob_threshold': use logprob_threshold"),
    (dict(without_timestamps=True), "unknown transcribe option 'without_timestamps': use timestamps=False"),
    (dict(prefix="Hello"), "unknown transcribe option 'prefix': it is not one encdec takes"),
])
def test_options_past_the_engine_are_refused_before_decoding(tiny_en, corpus, options, message):
    with pytest.raises(ValueError, match=message):
        tiny_en.transcribe(corpus[0].pair, **options)
    assert_all_blocks_free(tiny_en)


def test_a_waveform_alone_is_one_16khz_input_and_bad_inputs_are_named(tiny_en, corpus):
    """As openai-whisper's `transcribe(model, audio)`: an array or tensor is one 16 kHz waveform."""
    clip = corpus[0]
    texts = [r.text for r in tiny_en.transcribe([clip.audio, torch.from_numpy(clip.audio), clip.pair])]
    assert texts[0] == texts[1] == texts[2] != ""
    for inputs, message in [
            (None, "inputs must be a path .* or a list of them, got NoneType"), (b"/a.wav", "got bytes"),
            ({"audio": clip.audio}, "got dict"), (np.zeros((2, 100), np.float32), "waveform alone must be 1-D"),
            ((clip.audio, "16000"), "waveform: sample rate must be an integer .*got '16000'"),
            ((clip.audio, True), "sample rate .*got True"),
            ([clip.pair, (np.zeros(5, np.float32), 0)], "input 1: waveform: sample rate")]:
        with pytest.raises(ValueError, match=message):
            tiny_en.transcribe(inputs)
    assert_all_blocks_free(tiny_en)


@pytest.mark.parametrize("options", [{}, {"word_timestamps": True, "windows_at_once": True},
                                     {"vad_filter": True}])
def test_no_samples_is_an_empty_transcript(tiny_en, corpus, tmp_path, options):
    """As openai-whisper and faster-whisper give one (the other inputs are transcribed)."""
    path = tmp_path / "header_only.wav"
    soundfile.write(path, np.zeros(0, np.float32), 8000)
    (expected,) = tiny_en.transcribe([corpus[0].pair], **options)
    empty, clip, file = tiny_en.transcribe([np.zeros(0, np.float32), corpus[0].pair, str(path)], **options)
    for none in (empty, file):
        assert (none.text, none.segments, none.duration) == ("", [], 0.0)
    assert clip.text == expected.text != ""
    assert_all_blocks_free(tiny_en)


def test_a_binary_file_object_is_one_input(tiny_en, corpus, tmp_path):
    """faster-whisper's BinaryIO input: decoded as the file at its path is (it used to be
    iterated as a list of inputs, line by line)."""
    path = tmp_path / "clip.flac"
    soundfile.write(path, corpus[0].audio, 16000)
    (expected,) = tiny_en.transcribe(str(path))
    with open(path, "rb") as one, open(path, "rb") as two:
        assert [r.text for r in tiny_en.transcribe(one)] == [expected.text] != [""]
        assert [r.text for r in tiny_en.transcribe([two, str(path)])] == [expected.text] * 2
    with open(path, errors="ignore") as text, pytest.raises(ValueError, match="must be opened in binary mode"):
        tiny_en.transcribe(text)
    assert_all_blocks_free(tiny_en)


def test_default_fallback_samples_fit_a_small_engine(corpus):
    """openai-whisper's 5 samples per fallback shrink to max_num_seqs=2 (asked for, 5 is refused)."""
    from encdec import LLM

    small = LLM("tiny.en", max_num_seqs=2, num_gpu_blocks=400)
    # every decode "repeats itself": the window falls back through all six temperatures, and
    # the likeliest decode, a sampled one, is kept
    (result,) = small.transcribe(corpus[0].pair, compression_ratio_threshold=0.01)
    assert result.segments and result.segments[0].temperature > 0
    with pytest.raises(ValueError, match="best_of=5"):
        small.transcribe(corpus[0].pair, best_of=5)
    assert_all_blocks_free(small)


@pytest.mark.extended
def test_openai_defaults_beam_search_matches_faster_whisper(tiny_en, reference_model, corpus):
    """openai-whisper's CLI defaults (beam 5, best_of 5, temperature fallback) against
    faster-whisper's defaults (the same)."""
    texts = [clip.text for clip in corpus]
    ours = tiny_en.transcribe([clip.pair for clip in corpus], beam_size=5, best_of=5)
    theirs = [fw_text(reference_model.transcribe(clip.audio, beam_size=5)[0]) for clip in corpus]
    ours_wer, theirs_wer = wer(texts, [r.text for r in ours]), wer(texts, theirs)
    print(f"beam 5: WER encdec {ours_wer:.2%}, faster-whisper {theirs_wer:.2%}")
    assert ours_wer <= theirs_wer + 0.005
    assert_all_blocks_free(tiny_en)
