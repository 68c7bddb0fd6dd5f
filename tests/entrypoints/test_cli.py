"""`encdec` end to end through `main([...])` with the bundled Whisper tiny.en (no network).

tiny.en loads once per session: `cli_args.load_llm` is wrapped so later calls for the same model
get the same `LLM` (the first call goes through the real loader).
"""
from __future__ import annotations

import argparse
import errno
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from encdec.entrypoints import cli, cli_args, transcribe_cli
from encdec.entrypoints.summarize_cli import one_line
from tests.bart_checkpoints import summary_prompts

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"
SAMPLE_TEXT = "Thank you for calling. Please leave a message after the tone."
SEGMENT_LINE = re.compile(r"^\[(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d)\.(\d\d\d)\] (.*)$")
LOAD_LLM = cli_args.load_llm  # the real loader, before the fixture below wraps it
CUE = re.compile(r"(?:^|\n)(?:(\d+)\n)?(?:(\d\d):)?(\d\d):(\d\d)([.,])(\d\d\d) --> "  # vtt: no hours under one
                 r"(?:(\d\d):)?(\d\d):(\d\d)\5(\d\d\d)\n(.+)")


@pytest.fixture(scope="session")
def tiny_en():
    return LOAD_LLM(argparse.Namespace(model="tiny.en", dtype="auto", device=None, quantization=None))


@pytest.fixture(autouse=True)
def cached_model(monkeypatch, request):
    def load(args):
        if (args.model, args.dtype, args.device) == ("tiny.en", "auto", None):
            return request.getfixturevalue("tiny_en")
        return LOAD_LLM(args)

    monkeypatch.setattr(cli_args, "load_llm", load)


def stderr_lines(err: str) -> list[str]:
    """stderr without the progress bar's redraws (it moves with carriage returns)."""
    return [line for line in re.split(r"[\r\n]", err) if line.strip()]


def error_lines(err: str) -> list[str]:
    return [line for line in stderr_lines(err) if line.startswith("encdec: error:")]


def usage_error(err: str, command: str) -> str:
    """The one error line of a usage error, after the command's usage."""
    assert err.startswith(f"usage: encdec {command} "), err
    [line] = [line for line in stderr_lines(err) if line.startswith(f"encdec {command}: error: ")]
    return line.removeprefix(f"encdec {command}: error: ")


def parse_cues(text: str) -> list[tuple[int | None, int, int, str]]:
    """(index or None, start ms, end ms, text) of each srt / vtt cue."""
    cues = []
    for m in CUE.finditer(text):
        g = [int(x) if x and x.isdigit() else x for x in m.groups()]
        g[1], g[6] = g[1] or 0, g[6] or 0
        start = ((g[1] * 60 + g[2]) * 60 + g[3]) * 1000 + g[5]
        end = ((g[6] * 60 + g[7]) * 60 + g[8]) * 1000 + g[9]
        cues.append((g[0], start, end, g[10]))
    return cues


def test_transcribe_prints_segments_and_writes_every_format(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert cli.main(["transcribe", str(SAMPLE), "--output-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    assert error_lines(captured.err) == []
    lines = captured.out.splitlines()
    matches = [SEGMENT_LINE.match(line) for line in lines]
    assert lines and all(matches), lines
    assert " ".join(m.group(7).strip() for m in matches) == SAMPLE_TEXT
    assert all(m.group(7).startswith(" ") for m in matches)  # "]  text", as openai-whisper prints it
    times = [((int(m[1]) * 60 + int(m[2])) * 1000 + int(m[3]), (int(m[4]) * 60 + int(m[5])) * 1000
              + int(m[6])) for m in matches]
    assert all(0 <= a < b <= 4300 for a, b in times)

    assert sorted(p.name for p in out_dir.iterdir()) == [
        f"hello.{ext}" for ext in ("json", "srt", "tsv", "txt", "vtt")]
    srt = parse_cues((out_dir / "hello.srt").read_text())
    assert srt == [(i + 1, a, b, m.group(7).strip()) for i, ((a, b), m) in enumerate(zip(times, matches))]
    vtt_text = (out_dir / "hello.vtt").read_text()
    assert vtt_text.startswith("WEBVTT\n\n")
    assert parse_cues(vtt_text) == [(None, *cue[1:]) for cue in srt]
    tsv = [row.split("\t") for row in (out_dir / "hello.tsv").read_text().splitlines()[1:]]
    assert [(int(a), int(b), t) for a, b, t in tsv] == [cue[1:] for cue in srt]
    data = json.loads((out_dir / "hello.json").read_text())
    assert (data["text"], data["language"]) == (" " + SAMPLE_TEXT, "en")  # as decoded, as openai-whisper writes it
    assert data["duration"] == pytest.approx(soundfile.info(str(SAMPLE)).duration)
    assert [s["text"].strip() for s in data["segments"]] == [cue[3] for cue in srt]
    assert (out_dir / "hello.txt").read_text().split() == SAMPLE_TEXT.split()


def test_bad_files_are_reported_and_the_rest_finish(tmp_path, capsys):
    missing = tmp_path / "missing.wav"
    text = tmp_path / "text.wav"
    text.write_text("this is not audio\n")
    empty = tmp_path / "empty.wav"
    empty.touch()
    silence = tmp_path / "silence.wav"
    soundfile.write(str(silence), np.zeros(3 * 16000, dtype=np.int16), 16000)
    no_samples = tmp_path / "no_samples.wav"  # a header alone: an empty transcript, as openai-whisper's
    soundfile.write(str(no_samples), np.zeros(0, dtype=np.int16), 16000)
    files = [missing, text, SAMPLE, empty, silence, no_samples]
    status = cli.main(["transcribe", *map(str, files), "--no-timestamps", "--output-format",
                       "txt", "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()

    assert status == 1
    errors = error_lines(captured.err)
    assert len(errors) == 3, stderr_lines(captured.err)
    for path, error in zip((missing, text, empty), errors):
        assert error.startswith(f"encdec: error: {path}: ")
    assert "not found" in errors[0] and "not a readable audio file" in errors[1]
    assert "empty" in errors[2]
    assert captured.out == f"==> {SAMPLE} <==\n{SAMPLE_TEXT}\n==> {silence} <==\n==> {no_samples} <==\n"
    assert (tmp_path / "out" / "hello.txt").read_text().strip() == SAMPLE_TEXT
    assert (tmp_path / "out" / "silence.txt").read_text() == (tmp_path / "out" / "no_samples.txt").read_text() == ""


def test_each_batch_reads_its_files_when_it_comes(tmp_path, capsys, monkeypatch):
    """Files are checked first, then read again batch by batch (many long files are never all in
    memory): one replaced meanwhile is transcribed as it is then, one removed is an error."""
    first, replaced, removed = (tmp_path / f"{name}.wav" for name in ("first", "replaced", "removed"))
    for path in (first, replaced, removed):
        soundfile.write(str(path), np.zeros(16000, dtype=np.int16), 16000)
    transcribe = transcribe_cli.transcribe_batch

    def after_the_first(llm, batch, args, on_progress):
        if batch[0][0] == str(first):
            shutil.copy(SAMPLE, replaced)
            removed.unlink()
        return transcribe(llm, batch, args, on_progress)

    monkeypatch.setattr(transcribe_cli, "transcribe_batch", after_the_first)
    assert cli.main(["transcribe", *map(str, (first, replaced, removed)), "--batch_size", "1",
                     "--no-timestamps"]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"==> {first} <==\n==> {replaced} <==\n{SAMPLE_TEXT}\n"
    assert error_lines(captured.err) == [f"encdec: error: {removed}: audio file not found"]


def test_only_bad_files_never_loads_the_model(tiny_bart_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_args, "load_llm", lambda args: pytest.fail("model loaded"))
    assert cli.main(["transcribe", str(tmp_path / "nope.flac")]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"encdec: error: {tmp_path / 'nope.flac'}: audio file not found"]
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "--file", str(tmp_path / "nope.txt")]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"encdec: error: {tmp_path / 'nope.txt'}: no such file or directory"]


def test_model_and_option_errors(tmp_path, capsys):
    assert cli.main(["transcribe", str(SAMPLE), "--model", str(tmp_path)]) == 2
    [error] = error_lines(capsys.readouterr().err)
    assert error.startswith(f"encdec: error: --model {str(tmp_path)!r}")
    assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--task", "translate"]) == 2
    err = capsys.readouterr().err
    assert usage_error(err, "transcribe") == (
        "--task translate needs a multilingual model; tiny.en is English-only (it writes all "
        "speech as English: leave --task out)")
    assert error_lines(err) == []  # once, not once per file


def test_a_text_model_is_refused_once(tiny_bart_dir, capsys):
    assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--model", str(tiny_bart_dir)]) == 2
    err = capsys.readouterr().err
    assert usage_error(err, "transcribe") == (
        f"--model {tiny_bart_dir}: not a Whisper model (transcribe needs one)")
    assert error_lines(err) == []


def test_token_ids_beyond_the_vocabulary_are_refused_once(capsys):
    assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--suppress_tokens=-1,99999999"]) == 2
    err = capsys.readouterr().err
    assert usage_error(err, "transcribe") == (
        "--suppress_tokens: 99999999 is not a token id of tiny.en (its ids end at 51863)")
    assert error_lines(err) == []


@pytest.mark.parametrize("output", ["afile", "afile/sub"])
def test_output_dir_is_checked_before_transcribing(tmp_path, monkeypatch, capsys, output):
    monkeypatch.setattr(transcribe_cli, "load_audio", lambda name, **_: pytest.fail("audio decoded"))
    (tmp_path / "afile").touch()
    target = tmp_path / output
    assert cli.main(["transcribe", str(SAMPLE), "-o", str(target)]) == 2
    assert usage_error(capsys.readouterr().err, "transcribe") == f"--output_dir {target}: not a directory"


def test_unwritable_output_dir_is_found_before_transcribing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(transcribe_cli, "load_audio", lambda name, **_: pytest.fail("audio decoded"))
    monkeypatch.setattr(cli_args.os, "access", lambda path, mode: False)  # tests may run as root
    assert cli.main(["transcribe", str(SAMPLE), "-o", str(tmp_path)]) == 2
    assert usage_error(capsys.readouterr().err, "transcribe") == f"--output_dir {tmp_path}: permission denied"


def test_an_output_that_cannot_be_written_is_named(tmp_path, capsys):
    (tmp_path / "hello.txt").mkdir()  # where the transcript would go
    assert cli.main(["transcribe", str(SAMPLE), "-f", "txt", "-o", str(tmp_path)]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"encdec: error: {SAMPLE}: cannot write {tmp_path / 'hello.txt'}: is a directory"]


def test_read_errors_say_what_went_wrong_once(monkeypatch, capsys):
    def unreadable(name, **options):  # as encdec.audio words what the decoders raise
        cause = PermissionError(errno.EACCES, "Permission denied", f"/tmp/folder/{name}")
        raise ValueError(f"{name}: not a readable audio file ({cause})") from cause

    monkeypatch.setattr(transcribe_cli, "load_audio", unreadable)
    assert cli.main(["transcribe", "unr.wav"]) == 1
    assert error_lines(capsys.readouterr().err) == ["encdec: error: unr.wav: permission denied"]


def test_punctuation_flags_reach_the_word_timings(tmp_path):
    words = []
    for marks in ([], ["--append_punctuations", ""]):
        assert cli.main(["transcribe", str(SAMPLE), "-f", "json", "-o", str(tmp_path),
                         "--word_timestamps", "True", *marks]) == 0
        data = json.loads((tmp_path / "hello.json").read_text())
        words.append([w["word"].strip() for s in data["segments"] for w in s["words"]])
    assert words[0] == SAMPLE_TEXT.split()
    assert words[1] == SAMPLE_TEXT.replace(".", " .").split()  # no mark joins the word before


def test_usage_errors(capsys):
    assert cli.main(["transcribe"]) == 2
    assert cli.main(["transcribe", "x.wav", "--batch-size", "0"]) == 2
    capsys.readouterr()
    assert cli.main(["transcribe", "x.wav", "--bogus"]) == 2
    assert usage_error(capsys.readouterr().err, "transcribe") == "unrecognized arguments: --bogus"
    assert cli.main([]) == 2
    assert cli.main(["bench", "nosuch"]) == 2


def test_options_against_the_model_are_usage_errors(capsys):
    """Checked once the model is loaded, before any file is decoded, worded as flags."""
    assert cli.main(["transcribe", str(SAMPLE), "--initial_prompt", "Hi <|endoftext|>"]) == 2
    assert usage_error(capsys.readouterr().err, "transcribe") == (
        "--initial_prompt contains '<|endoftext|>', the text of a special token; a prompt is plain text")


def test_bench_runs_the_checkout_script(capfd):
    assert cli.main(["bench", "overhead", "--help"]) == 0
    assert "Engine overhead per decode step" in capfd.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["bart", "--rounds", "-1"], "argument --rounds: expected an integer >= 1, got '-1'"),
    (["whisper", "--engines", "fw-int8,foo"], "argument --engines: expected comma-separated "
                                               "names of encdec, encdec-parallel,"),
    (["overhead", "--batch-sizes", "1,0"], "argument --batch-sizes: expected comma-separated "
                                           "integers >= 1, got '1,0'"),
])
def test_bench_options_are_checked_before_anything_runs(capfd, argv, message):
    assert cli.main(["bench", *argv]) == 2
    assert message in capfd.readouterr().err


def test_summarize(tiny_bart_dir, tmp_path, capsys):
    article = tmp_path / "article.txt"
    article.write_text("The encoder reads the whole document once; the decoder writes the summary.")
    gone = tmp_path / "gone.txt"
    status = cli.main(["summarize", "--model", str(tiny_bart_dir), "The rain in spain falls.",
                       "--file", str(article), "--file", str(gone), "--max-tokens", "8"])
    captured = capsys.readouterr()
    assert status == 1  # the missing file; the two texts are still summarized
    assert error_lines(captured.err) == [f"encdec: error: {gone}: no such file or directory"]
    lines = captured.out.splitlines()  # line i answers input i; the missing file's is empty
    assert len(lines) == 3 and all(lines[:2]) and lines[2] == ""


def test_a_failed_text_keeps_its_line(tiny_bart_dir, capsys):
    long = "The rain in spain falls mainly on the plain. " * 40  # over the 256 positions
    status = cli.main(["summarize", "--model", str(tiny_bart_dir), "First text.", "",
                       long, "Last text.", "--no-truncate", "--max-tokens", "6"])
    captured = capsys.readouterr()
    assert status == 1
    assert [line.split(":")[2] for line in error_lines(captured.err)] == [" TEXT 2", " TEXT 3"]
    lines = captured.out.splitlines()
    assert len(lines) == 4 and lines[1] == lines[2] == "" and lines[0] and lines[3]
    alone = cli.main(["summarize", "--model", str(tiny_bart_dir), "Last text.", "--max-tokens", "6"])
    assert alone == 0 and capsys.readouterr().out.splitlines() == [lines[3]]


def test_when_no_text_can_be_summarized_each_keeps_an_empty_line(tiny_bart_dir, capsys):
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "", " "]) == 1
    captured = capsys.readouterr()
    assert captured.out == "\n\n" and len(error_lines(captured.err)) == 2


def test_summarize_decoding_options_decode_as_the_llm_does(tiny_bart_dir, capsys, monkeypatch):
    """--temperature with --seed, --no-repeat-ngram-size, and --top-k with --top-p give what
    `LLM.generate` gives with them (each changes the output here); --file - reads standard input."""
    from encdec import LLM, SamplingParams

    text = "The encoder reads the whole document once; the decoder writes the summary."
    llm = LLM(model=str(tiny_bart_dir))

    def offline(**fields):
        params = SamplingParams(max_tokens=12, config_per_field=True, **fields)
        return one_line(llm.generate(summary_prompts(llm, [text]), params, use_tqdm=False)[0].outputs[0].text)

    for options, fields, other in [
        (["--temperature", "1", "--seed", "3"], dict(temperature=1.0, seed=3), dict(temperature=1.0, seed=4)),
        (["--temperature", "0", "--no-repeat-ngram-size", "1"], dict(temperature=0.0, no_repeat_ngram_size=1),
         dict(temperature=0.0)),
        (["--temperature", "1", "--seed", "3", "--top-k", "3", "--top-p", "0.6"],
         dict(temperature=1.0, seed=3, top_k=3, top_p=0.6), dict(temperature=1.0, seed=3)),
    ]:
        assert offline(**fields) != offline(**other)  # the option matters here
        monkeypatch.setattr(sys, "stdin", io.StringIO(text))
        assert cli.main(["summarize", "--model", str(tiny_bart_dir), "--file", "-", "--max-tokens", "12",
                         *options]) == 0
        assert capsys.readouterr().out == offline(**fields) + "\n"


def test_one_line():
    assert one_line(" A  summary \n\n in two\r\nlines. ") == "A  summary in two lines."


def test_an_output_with_line_breaks_keeps_to_its_line(tiny_bart_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from encdec import LLM, SamplingParams

    chatty = Path(shutil.copytree(tiny_bart_dir, tmp_path / "chatty"))  # likes to write "\n"
    [newline] = AutoTokenizer.from_pretrained(chatty)("\n", add_special_tokens=False)["input_ids"]
    weights = load_file(chatty / "model.safetensors")
    weights["final_logits_bias"][0, newline] += 8.0
    save_file(weights, chatty / "model.safetensors", metadata={"format": "pt"})
    texts = ["The rain in spain falls.", "First text.", "Last text."]
    llm = LLM(model=str(chatty))
    offline = [o.outputs[0].text for o in llm.generate(
        summary_prompts(llm, texts), SamplingParams(temperature=0.0, max_tokens=8, config_per_field=True),
        use_tqdm=False)]
    assert any("\n" in text.strip() for text in offline)  # the case under test
    status = cli.main(["summarize", "--model", str(chatty), *texts, "--temperature", "0",
                       "--max-tokens", "8"])
    assert status == 0
    assert capsys.readouterr().out.splitlines() == [" ".join(t.split()) for t in offline]


def test_console_script_help():
    script = Path(sys.executable).with_name("encdec")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: encdec")
    for command in ("transcribe", "summarize", "serve", "bench"):
        assert command in done.stdout


def test_summarize_truncates_and_says_so(tiny_bart_dir, capsys):
    article = "The rain in spain falls mainly on the plain. " * 40  # over the 256 positions
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), article, "--max-tokens", "4",
                     "--num-beams", "2", "--no-repeat-ngram-size", "2"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1
    assert "encdec: note: TEXT 1: cut to the model's limit of 256 input tokens" in captured.err

    assert cli.main(["summarize", "--model", str(tiny_bart_dir), article, "--no-truncate"]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert re.fullmatch(r"encdec: error: TEXT 1: the text has \d+ tokens, more than the model's limit "
                        r"of 256 input tokens \(without --no-truncate it is cut to fit\)", line)


def test_summarize_words_errors_as_options(tiny_bart_dir, capsys):
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "text", "--min-tokens", "9",
                     "--max-tokens", "3"]) == 2
    assert usage_error(capsys.readouterr().err, "summarize") == (
        "--min-tokens must be <= --max-tokens=3, got 9")
    # the length limit of the checkpoint's generation config, which the user did not set: it has
    # no max_length, so 20 new tokens, as generate() makes
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "text", "--min-tokens", "21"]) == 2
    assert usage_error(capsys.readouterr().err, "summarize") == (
        "--min-tokens 21: the checkpoint's default max tokens is 20; set --max-tokens")
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "text", "--min-tokens", "20"]) == 0
    capsys.readouterr()
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "text", "--min-tokens", "300",
                     "--max-tokens", "300"]) == 2
    assert usage_error(capsys.readouterr().err, "summarize") == (
        "--max-tokens=300 is more than the decoder has room for: it holds 256 positions and the "
        "decoder prompt takes 1 token, so at most 256 (the last new token takes no position)")
    assert cli.main(["summarize", "--model", str(tiny_bart_dir)]) == 2
    assert usage_error(capsys.readouterr().err, "summarize") == "give at least one TEXT or --file (--file - reads standard input)"
    assert cli.main(["summarize", "--model", str(tiny_bart_dir / "missing"), "text"]) == 2
    assert error_lines(capsys.readouterr().err)[0].startswith(
        f"encdec: error: --model {tiny_bart_dir / 'missing'}: no such directory")


def test_summarize_refuses_what_is_not_a_text_model(tiny_bart_dir, tmp_path, capsys):
    from tests.models.test_whisper_parity import make_whisper_checkpoint

    whisper_dir = make_whisper_checkpoint(tmp_path / "whisper")
    capsys.readouterr()  # transformers' progress bars
    assert cli.main(["summarize", "--model", str(whisper_dir), "text"]) == 2
    assert usage_error(capsys.readouterr().err, "summarize") == (
        f"--model {whisper_dir}: a Whisper checkpoint takes audio (summarize takes a text model such "
        f"as BART, PEGASUS or T5; for speech use encdec transcribe)")
    bare = tmp_path / "bare"  # weights and config, no tokenizer files
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (tiny_bart_dir / name).exists():
            shutil.copy(tiny_bart_dir / name, bare / name)
    assert cli.main(["summarize", "--model", str(bare), "text"]) == 2
    assert usage_error(capsys.readouterr().err, "summarize").startswith(
        f"--model {bare}: the directory has no tokenizer files")
    binary = tmp_path / "notes.txt"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "--file", str(binary), "text"]) == 1
    captured = capsys.readouterr()
    assert error_lines(captured.err) == [f"encdec: error: {binary}: not UTF-8 text"]
    assert len(captured.out.splitlines()) == 2 and captured.out.splitlines()[1] == ""  # its line, empty
    marked = tmp_path / "marked.txt"  # a byte-order mark alone is an empty text, not a text to summarize
    marked.write_bytes(b"\xef\xbb\xbf \n")
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "--file", str(marked)]) == 1
    assert error_lines(capsys.readouterr().err) == [f"encdec: error: {marked}: the text to summarize is empty"]


def test_serve_help_lists_every_option(capsys):
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--model", "--served-model-name", "--host", "--port", "--api-key", "--max-upload-mb",
                   "--max-audio-seconds", "--max-waiting-requests", "--shutdown-timeout",
                   "--kv-cache-space", "--num-gpu-blocks", "--max-num-seqs", "--max-running-requests", "--dtype",
                   "--device"):
        assert option in out


def test_word_timestamps_json_words_and_highlighted_lines(tmp_path, capsys):
    assert cli.main(["transcribe", str(SAMPLE), "-o", str(tmp_path), "--word_timestamps", "True",
                     "--highlight_words", "True", "--max_line_width", "24"]) == 0
    assert error_lines(capsys.readouterr().err) == []
    data = json.loads((tmp_path / "hello.json").read_text())
    words = [w for s in data["segments"] for w in s["words"]]
    assert [w["word"].strip() for w in words] == SAMPLE_TEXT.split()
    assert all(set(w) == {"word", "start", "end", "probability"} for w in words)
    times = [t for w in words for t in (w["start"], w["end"])]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= data["duration"]
    for segment in data["segments"]:
        assert segment["start"] <= segment["words"][0]["start"] <= segment["words"][-1]["end"] <= segment["end"]

    cues = parse_srt_blocks((tmp_path / "hello.srt").read_text())
    assert all(len(re.sub("</?u>", "", line)) <= 24 for _, _, text in cues for line in text.split("\n"))
    highlighted = [(start, end, re.findall(r"<u>(.*?)</u>", text)) for start, end, text in cues
                   if "<u>" in text]
    assert highlighted == [(round(w["start"] * 1000), round(w["end"] * 1000), [w["word"].strip()])
                           for w in words]  # each word underlined once, timed to the word


def parse_srt_blocks(text: str) -> list[tuple[int, int, str]]:
    """(start ms, end ms, text with its line breaks) of each srt cue."""
    cues = []
    for block in text.strip().split("\n\n"):
        _, times, *lines = block.split("\n")
        start, end = (sum(int(x) * f for x, f in zip(re.split("[:,]", t), (3600000, 60000, 1000, 1)))
                      for t in times.split(" --> "))
        cues.append((start, end, "\n".join(lines)))
    return cues


def test_fast_greedy_switch(capsys):
    assert cli.main(["transcribe", str(SAMPLE), "--beam_size", "1", "--no_fallback",
                     "--no-timestamps"]) == 0
    assert capsys.readouterr().out.strip() == SAMPLE_TEXT
