"""`LLM.transcribe`'s openai-whisper arguments `verbose` and `fp16`
(`encdec.entrypoints.whisper_console`); `verbose=True` against openai-whisper's own lines:
test_openai_whisper_parity.py."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from encdec.entrypoints.whisper_console import Printer, check_fp16
from encdec.whisper.transcript import Segment
from tests.conftest import assert_all_blocks_free


def test_verbose_none_prints_nothing_and_false_shows_a_bar_over_the_frames(tiny_en, corpus, capsys):
    tiny_en.transcribe(corpus[0].pair)
    assert capsys.readouterr() == ("", "")
    seen = []
    tiny_en.transcribe([corpus[0].pair, corpus[1].pair], verbose=False, on_progress=seen.append)
    out, err = capsys.readouterr()
    frames = round((len(corpus[0].audio) + len(corpus[1].audio)) / 160)
    assert out == "" and f"{frames}/{frames} [" in err and "frames/s" in err
    assert seen[-1] == pytest.approx(frames / 100, abs=0.01)  # the caller's on_progress still hears


def test_verbose_names_the_input_before_its_lines_when_there_are_several(tiny_en, corpus, capsys):
    results = tiny_en.transcribe([corpus[0].pair, corpus[1].pair], verbose=True)
    lines = capsys.readouterr().out.splitlines()
    for index, result in enumerate(results):
        header = lines.index(f"==> input {index} <==")
        printed = []
        for line in lines[header + 1:]:
            if line.startswith("==> "):
                break
            printed.append(line)
        pattern = r"\[\d\d:\d\d\.\d{3} --> \d\d:\d\d\.\d{3}\] .+"
        assert printed and all(re.fullmatch(pattern, p) for p in printed)
        assert "".join(p.split("] ", 1)[1] for p in printed) == "".join(s.text for s in result.segments)
    assert_all_blocks_free(tiny_en)


def test_verbose_prints_no_line_for_an_emptied_segment():
    """Segments emptied for having no length or no text are in the transcript, not printed."""
    lines = []
    Printer(["a.wav"], True, lines.append).segments(0, [
        Segment(0.0, 1.0, " Hi."), Segment(1.0, 1.0, ""), Segment(1.0, 2.0, " ")])
    assert lines == ["[00:00.000 --> 00:01.000]  Hi."]


def test_fp16_warns_only_when_the_llm_runs_another_precision():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_fp16(None, torch.float32)
        check_fp16(False, torch.float32)
        check_fp16(True, torch.float16)
    with pytest.warns(UserWarning, match=r"fp16=True: this LLM runs in float32"):
        check_fp16(True, torch.float32)
    with pytest.warns(UserWarning, match=r"fp16=False: this LLM runs in bfloat16"):
        check_fp16(False, torch.bfloat16)


@pytest.mark.parametrize("options, message", [({"verbose": 1}, "verbose must be True, False or None, got 1"),
                                              ({"fp16": "no"}, "fp16 must be True, False or None, got 'no'")])
def test_bad_verbose_or_fp16_is_a_value_error_naming_it(tiny_en, corpus, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_en.transcribe(corpus[0].pair, **options)
    assert_all_blocks_free(tiny_en)
