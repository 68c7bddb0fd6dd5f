"""`encdec transcribe`'s openai-whisper flags: each reaches `TranscribeOptions` or the writers,
bad values stop with an error naming the flag, and --help groups them. The model is a stand-in
that records what `LLM.transcribe` was given (test_cli.py runs the real tiny.en)."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from encdec.config import SchedulerConfig
from encdec.entrypoints import cli, cli_args
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Segment, Transcription, Word
from encdec.whisper.vad import VadOptions
from tests.entrypoints.conftest import SAMPLE

WORDS = ["Thank", "you", "for", "calling."]


class RecordingLLM:
    """Answers every input with one segment of four timed words; keeps the options it got."""

    llm_engine = SimpleNamespace(
        model_config=SimpleNamespace(special_tokens=WhisperTokens(
            eot=50, sot=51, no_timestamps=None, multilingual=True, sot_prev=52,
            lang_to_id={"en": 53, "fr": 54}, task_to_id={"transcribe": 55, "translate": 56}), vocab_size=100,
            max_encoder_len=1500, max_decoder_len=448),
        scheduler_config=SchedulerConfig(), check_can_ever_fit=lambda *sizes_and_field: None,
        tokenizer=lambda text, add_special_tokens: {"input_ids": [2] * len(text.split())})

    def __init__(self):
        self.calls: list[dict] = []

    def transcribe(self, inputs, language=None, task="transcribe", on_progress=None, **options):
        self.calls.append(dict(language=language, task=task, **options))
        words = [Word(f" {w}", i * 0.5, i * 0.5 + 0.4, 0.9) for i, w in enumerate(WORDS)]
        segment = Segment(0.0, 2.0, " " + " ".join(WORDS), tokens=[1, 2, 3], words=words)
        return [Transcription(segment.text.strip(), "en", [segment], 2.0) for _ in inputs]

    def options(self) -> TranscribeOptions:
        """What the last call's options make of `TranscribeOptions`."""
        [call] = self.calls[-1:]
        return TranscribeOptions(**call)


@pytest.fixture
def llm(monkeypatch):
    recorder = RecordingLLM()
    monkeypatch.setattr(cli_args, "load_llm", lambda args: recorder)
    return recorder


def run(*argv: str) -> int:
    return cli.main(["transcribe", str(SAMPLE), *argv])


def test_defaults_are_openai_whispers(llm):
    assert run() == 0
    o = llm.options()
    assert (o.beam_size, o.best_of, o.patience) == (5, 5, None)
    assert o.temperature == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert (o.compression_ratio_threshold, o.logprob_threshold, o.no_speech_threshold) == (2.4, -1.0, 0.6)
    assert (o.condition_on_previous_text, o.suppress_blank, o.word_timestamps, o.vad_filter) == (
        True, True, False, False)
    assert (o.suppress_tokens, o.clip_timestamps, o.initial_prompt, o.timestamps) == ([-1], [0.0], None, True)
    assert (llm.calls[0]["language"], llm.calls[0]["task"]) == (None, "transcribe")


@pytest.mark.parametrize("argv, expected", [
    (["--beam_size", "1", "--no_fallback"], dict(beam_size=1, temperature=(0.0,))),
    (["--beam_size", "1", "--temperature", "0", "--temperature_increment_on_fallback", "0"],
     dict(beam_size=1, temperature=(0.0,))),
    (["--temperature_increment_on_fallback", "None"], dict(temperature=(0.0,))),
    (["--temperature", "0.4", "--temperature_increment_on_fallback", "0.3"],
     dict(temperature=(0.4, 0.7, 1.0))),
    (["--best_of", "3", "--beam_size", "None"], dict(best_of=3, beam_size=None)),
    (["--beam_size", "4", "--patience", "1.5"], dict(beam_size=4, patience=1.5)),
    (["--length_penalty", "0.6"], dict(length_penalty=0.6)),
    (["--repetition_penalty", "1.3", "--no_repeat_ngram_size", "3"], dict(repetition_penalty=1.3, no_repeat_ngram_size=3)),
    (["--max_new_tokens", "12"], dict(max_new_tokens=12)),
    (["--best_of", "None"], dict(best_of=1)),  # openai-whisper's optional_int
    (["--compression_ratio_threshold", "None", "--logprob_threshold", "-0.5",
      "--no_speech_threshold", "0.3"],
     dict(compression_ratio_threshold=None, logprob_threshold=-0.5, no_speech_threshold=0.3)),
    (["--condition_on_previous_text", "False"], dict(condition_on_previous_text=False)),
    (["--initial_prompt", "Hi.", "--carry_initial_prompt", "True", "--hotwords", "Ada"],
     dict(initial_prompt="Hi.", carry_initial_prompt=True, hotwords="Ada")),
    (["--initial-prompt", "Dashed."], dict(initial_prompt="Dashed.")),
    (["--suppress_tokens", "11,13", "--suppress_blank", "false"],
     dict(suppress_tokens=[11, 13], suppress_blank=False)),
    (["--clip_timestamps", "0.5,2"], dict(clip_timestamps=[0.5, 2.0])),
    (["--word_timestamps", "True", "--hallucination_silence_threshold", "2"],
     dict(word_timestamps=True, hallucination_silence_threshold=2.0)),
    (["--no-timestamps"], dict(timestamps=False)),
    (["--vad_filter", "True"], dict(vad_filter=True, vad_parameters=None)),
    (["--vad_filter", "True", "--vad_threshold", "0.3", "--vad_neg_threshold", "0.2",
      "--vad_min_speech_duration_ms", "250", "--vad_max_speech_duration_s", "20",
      "--vad_min_silence_duration_ms", "500", "--vad_speech_pad_ms", "100"],
     dict(vad_filter=True, vad_parameters=VadOptions(0.3, 0.2, 250, 20.0, 500, 100))),
])
def test_flags_reach_transcribe_options(llm, argv, expected):
    assert run(*argv) == 0
    options = llm.options()
    assert {name: getattr(options, name) for name in expected} == expected


def test_fallback_temperatures_are_openai_whispers():
    """The command line's schedule, as openai-whisper's `np.arange(t, 1 + 1e-6, increment)`."""
    import numpy as np

    from encdec.entrypoints.whisper_options import fallback_temperatures

    for start in np.round(np.arange(0.0, 1.05, 0.1), 1):
        for increment in (0.1, 0.2, 0.3):
            expected = tuple(float(t) for t in np.round(np.arange(start, 1.0 + 1e-6, increment), 6))
            assert fallback_temperatures(float(start), increment) == expected, (start, increment)


def test_language_task_batch_size_and_threads(llm, monkeypatch):
    threads = []
    monkeypatch.setattr(cli_args.torch, "set_num_threads", threads.append)
    assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--language", "en", "--batch_size", "1",
                     "--threads", "2"]) == 0
    assert threads == [2]
    assert [(c["language"], c["task"]) for c in llm.calls] == [("en", "transcribe")] * 2  # one per batch
    assert run("--threads", "0") == 0 and threads == [2]  # 0: torch's default, untouched


def test_verbose_false_prints_nothing_but_writes(llm, tmp_path, capsys):
    assert run("--verbose", "False", "--language", "en", "-o", str(tmp_path)) == 0
    assert capsys.readouterr().out == ""
    assert (tmp_path / "hello.txt").read_text().split() == WORDS
    assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--verbose", "False", "--language", "en"]) == 0
    assert capsys.readouterr().out == ""  # no "==> FILE <==" lines either
    # as openai-whisper's: a detected language is named even then, and explained with --verbose True
    assert run("--verbose", "False") == 0
    assert capsys.readouterr().out == "Detected language: English\n"
    assert run("--verbose", "True") == 0
    assert capsys.readouterr().out.splitlines() == [
        "Detecting language using up to the first 30 seconds. Use `--language` to specify the language",
        "Detected language: English", f"[00:00.000 --> 00:02.000]  {' '.join(WORDS)}"]


@pytest.mark.parametrize("spelling", [["-f", "{fmt}", "-o", "{dir}"],
                                      ["--output_format", "{fmt}", "--output_dir", "{dir}"],
                                      ["--output-format", "{fmt}", "--output-dir", "{dir}"]])
def test_output_spellings(llm, tmp_path, spelling):
    argv = [a.format(fmt="verbose_json", dir=tmp_path) for a in spelling]
    assert run(*argv, "--word_timestamps", "True") == 0
    data = json.loads((tmp_path / "hello.verbose.json").read_text())
    assert (data["task"], data["language"], data["text"]) == ("transcribe", "english", " ".join(WORDS))
    assert [w["word"] for w in data["words"]] == WORDS
    assert set(data["segments"][0]) == {"id", "seek", "start", "end", "text", "tokens", "temperature",
                                        "avg_logprob", "compression_ratio", "no_speech_prob"}


def srt_cues(path) -> list[tuple[str, str]]:
    """(time line, text) of each srt cue."""
    blocks = path.read_text().strip().split("\n\n")
    return [(b.split("\n")[1], "\n".join(b.split("\n")[2:])) for b in blocks]


def test_subtitle_flags(llm, tmp_path):
    assert run("-f", "srt", "-o", str(tmp_path), "--word_timestamps", "True",
               "--highlight_words", "True") == 0
    cues = srt_cues(tmp_path / "hello.srt")
    underlined = [re.findall(r"<u>(.*?)</u>", text) for _, text in cues if "<u>" in text]
    assert underlined == [[w] for w in WORDS]

    assert run("-f", "srt", "-o", str(tmp_path), "--word_timestamps", "True",
               "--max_line_width", "9", "--max_line_count", "1") == 0
    assert [text for _, text in srt_cues(tmp_path / "hello.srt")] == ["Thank you", "for", "calling."]

    assert run("-f", "srt", "-o", str(tmp_path), "--word_timestamps", "True",
               "--max_line_width", "9") == 0
    assert [text for _, text in srt_cues(tmp_path / "hello.srt")] == ["Thank you\nfor\ncalling."]

    assert run("-f", "srt", "-o", str(tmp_path), "--word_timestamps", "True",
               "--max_line_width", "9", "--max_words_per_line", "2") == 0  # both, as openai-whisper
    assert [text for _, text in srt_cues(tmp_path / "hello.srt")] == ["Thank you", "for\ncalling."]

    assert run("-f", "vtt", "-o", str(tmp_path), "--word_timestamps", "True",
               "--max_words_per_line", "3") == 0
    vtt = (tmp_path / "hello.vtt").read_text()
    assert "\nThank you for\n" in vtt and "\ncalling.\n" in vtt


@pytest.mark.parametrize("argv, unset, message", [
    (["--word_timestamps", "True", "--max_line_count", "2"], "max_line_count",
     "--max_line_count has no effect without --max_line_width"),
    (["--word_timestamps", "True", "--max_line_width", "20", "--max_line_count", "2",
      "--max_words_per_line", "3"],
     "max_words_per_line", "--max_words_per_line has no effect with --max_line_count"),
    (["--hallucination_silence_threshold", "2"], "hallucination_silence_threshold",
     "--hallucination_silence_threshold has no effect without --word_timestamps True"),
])
def test_flags_openai_whisper_ignores_are_ignored_with_a_warning(llm, capsys, tmp_path, argv, unset, message):
    """A warning, and the same options and subtitles as without the flag."""
    flag = argv.index(f"--{unset}")
    results = []
    for name, flags in (("with", argv), ("without", argv[:flag] + argv[flag + 2:])):
        assert run(*flags, "-f", "vtt", "-o", str(tmp_path / name)) == 0
        assert (message in capsys.readouterr().err) == (name == "with")
        results.append((llm.options(), (tmp_path / name / "hello.vtt").read_text()))
    assert results[0] == results[1]


def test_max_words_per_line_counts_when_max_line_count_does_not(llm, capsys, tmp_path):
    """Without --max_line_width, --max_line_count is the flag ignored; the words per line hold."""
    assert run("--word_timestamps", "True", "--max_line_count", "2", "--max_words_per_line", "3",
               "-f", "vtt", "-o", str(tmp_path)) == 0
    assert "--max_words_per_line" not in capsys.readouterr().err
    assert "\nThank you for\n" in (tmp_path / "hello.vtt").read_text()


def test_word_timestamps_on_a_translation_are_warned_about(llm, capsys):
    assert run("--task", "translate", "--word_timestamps", "True") == 0
    assert "encdec: warning: word-level timestamps on translations may not be reliable" in capsys.readouterr().err
    assert llm.options().word_timestamps


@pytest.mark.parametrize("argv, message", [
    (["--highlight_words", "True"], "--highlight_words needs --word_timestamps=True"),
    (["--max_line_width", "20"], "--max_line_width needs --word_timestamps=True"),
    (["--max_line_count", "2"], "--max_line_count needs --word_timestamps=True"),
    (["--max_words_per_line", "3"], "--max_words_per_line needs --word_timestamps=True"),
    (["--beam_size", "None", "--patience", "2"], "--patience must be a number > 0, with --beam_size set"),
    (["--vad_threshold", "1.5"], "--vad_threshold must be in [0, 1]"),
    (["--clip_timestamps", "3,1"], "--clip_timestamps must be"),
    (["--vad_filter", "True", "--clip_timestamps", "1,2"], "--clip_timestamps and --vad_filter exclude"),
])
def test_option_errors_name_the_flag(llm, capsys, argv, message):
    assert run(*argv) == 2
    assert message in capsys.readouterr().err
    assert llm.calls == []


@pytest.mark.parametrize("argv, message", [
    (["--word_timestamps", "yes"], "argument --word_timestamps: expected True or False, got 'yes'"),
    (["--beam_size", "0"], "argument --beam_size: expected an integer in [1, 256] or None, got '0'"),
    (["--best_of", "x"], "argument --best_of: expected an integer in [1, 256] or None, got 'x'"),
    (["--length_penalty", "2"], "argument --length_penalty: expected a number in [0, 1] or None, got '2'"),
    (["--temperature_increment_on_fallback", "-1"], "expected a finite number >= 0 or None, got '-1'"),
    (["--vad_speech_pad_ms", "-1"], "argument --vad_speech_pad_ms: expected a finite number >= 0, got '-1'"),
    (["--max_line_width", "0"], "argument --max_line_width: expected an integer >= 1"),
    (["--repetition_penalty", "0"], "argument --repetition_penalty: expected a finite number > 0, got '0'"),
    (["--max_new_tokens", "0"], "argument --max_new_tokens: expected an integer >= 1 or None, got '0'"),
    (["--threads", "-1"], f"argument --threads: expected an integer in [0, {cli_args.MAX_THREADS}], got '-1'"),
    (["-f", "doc"], "argument --output_format/-f: invalid choice: 'doc'"),
])
def test_usage_errors(llm, capsys, argv, message):
    assert run(*argv) == 2
    assert message in capsys.readouterr().err


def test_help_groups_the_flags(capsys):
    assert cli.main(["transcribe", "--help"]) == 0
    out = capsys.readouterr().out
    groups = {"model and input": ["--model", "--language", "--task", "--threads", "--batch_size"],
              "decoding": ["--beam_size", "--best_of", "--patience", "--length_penalty", "--temperature ",
                           "--suppress_tokens", "--suppress_blank", "--condition_on_previous_text",
                           "--repetition_penalty", "--no_repeat_ngram_size", "--max_new_tokens"],
              "temperature fallback and thresholds": [
                  "--temperature_increment_on_fallback", "--no_fallback",
                  "--compression_ratio_threshold", "--logprob_threshold", "--no_speech_threshold"],
              "prompt": ["--initial_prompt", "--carry_initial_prompt", "--hotwords"],
              "timestamps and words": ["--word_timestamps", "--clip_timestamps",
                                       "--hallucination_silence_threshold"],
              "voice activity detection": ["--vad_filter", "--vad_threshold", "--vad_neg_threshold",
                                           "--vad_min_speech_duration_ms", "--vad_max_speech_duration_s",
                                           "--vad_min_silence_duration_ms", "--vad_speech_pad_ms"],
              "output": ["--output_format", "--output_dir", "--verbose", "--highlight_words", "--max_line_width",
                         "--max_line_count", "--max_words_per_line"]}
    sections = re.split(r"\n(?=\S[^\n]*:\n)", out.split("\noptions:\n", 1)[1])
    by_title = {s.split(":\n", 1)[0]: s for s in sections}
    assert list(groups) == [t for t in by_title if t in groups]
    for title, flags in groups.items():
        for flag in flags:
            assert re.search(rf"\n  {re.escape(flag.strip())}[ ,\n]", by_title[title]), (title, flag)
    assert "-f FORMAT" in by_title["output"] and "-o OUTPUT_DIR" in by_title["output"]
    assert "--beam_size 1 --no_fallback" in out  # the fast greedy switch is documented


@pytest.mark.parametrize("gpu, argv, dtype", [
    (False, ["--fp16", "True"], "auto"),  # the CPU runs float32 regardless, as openai-whisper's
    (True, ["--fp16", "True"], "float16"),
    (True, ["--fp16", "True", "--dtype", "bfloat16"], "bfloat16"),
    (True, ["--fp16", "True", "--compute_type", "float32"], "float32"),
    (True, ["--fp16", "False"], "auto"),
    (True, [], "auto"),
])
def test_fp16_is_float16_on_cuda_unless_a_dtype_is_given(monkeypatch, gpu, argv, dtype):
    monkeypatch.setattr(cli_args.torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(cli_args.torch.cuda, "device_count", lambda: int(gpu))
    loaded = []
    monkeypatch.setattr(cli_args, "load_llm", lambda args: loaded.append(args.dtype) or RecordingLLM())
    assert run(*argv) == 0
    assert loaded == [dtype]


def test_model_dir_is_looked_in_before_the_bundled_models(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    models = []
    monkeypatch.setattr(cli_args, "load_llm", lambda args: models.append(args.model) or RecordingLLM())
    assert run("--model_dir", str(tmp_path), "--model", "mine") == 0
    assert run("--model_dir", str(tmp_path), "--model", "tiny.en") == 0  # not there: bundled
    assert models == [str(tmp_path / "mine"), "tiny.en"]


def test_vad_flags_without_vad_filter_get_a_warning(llm, capsys):
    assert run("--vad_threshold", "0.3", "--vad_speech_pad_ms", "100") == 0
    assert ("encdec: warning: --vad_threshold, --vad_speech_pad_ms do nothing without --vad_filter "
            "True") in capsys.readouterr().err
    assert run("--vad_filter", "True", "--vad_threshold", "0.3") == 0
    assert "warning" not in capsys.readouterr().err
