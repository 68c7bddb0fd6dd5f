"""The results file a resumed `encdec batch` appends to: its end is mended, a stranger line is an
error that names it, a transcript whose files cannot be written is an error row (no Ray needed)."""
from __future__ import annotations

import argparse
import json

import pytest

from encdec.entrypoints.cli import main
from encdec.entrypoints.ray.batch_cli import done_ids, write_results


def record(doc_id: str) -> str:
    return json.dumps({"id": doc_id, "summary": "s", "error": None})


def test_a_last_record_without_its_newline_gets_one(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(record("a") + "\n" + record("b"))
    assert done_ids(path) == {"a", "b"}
    assert path.read_text() == record("a") + "\n" + record("b") + "\n"


def test_a_line_cut_mid_write_is_dropped(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    path.write_text(record("a") + "\n" + record("b")[:-5])
    assert done_ids(path) == {"a"}
    assert path.read_text() == record("a") + "\n"
    assert f"encdec: warning: {path}: dropped its incomplete last line" in capsys.readouterr().err


def test_a_file_that_is_not_results_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text(record("a") + "\nnot json\n" + record("b") + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl, line 2: not a result record"):
        done_ids(out / "results.jsonl")
    assert main(["batch", "transcribe", "x.wav", "--output", str(out)]) == 2
    assert f"encdec: error: {out / 'results.jsonl'}, line 2: not a result record" in capsys.readouterr().err


def test_a_transcript_whose_files_cannot_be_written_is_an_error_row(tmp_path, capsys):
    (tmp_path / "a.srt").mkdir()  # in the way of a.wav's subtitles
    segment = dict(start=0.0, end=1.0, text=" Hi.", words=[])
    rows = [dict(id=f"/audio/{name}.wav", text=" Hi.", language="en", duration=1.0, segments=json.dumps([segment]),
                 error=None, node_id="n") for name in ("a", "b")]
    args = argparse.Namespace(output=str(tmp_path), output_format="srt", job="transcribe")
    assert write_results(rows, args, set(), len(rows)) == 1
    errors = [json.loads(line)["error"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert errors == ["its transcript files: is a directory", None]
    assert (tmp_path / "b.srt").read_text().startswith("1\n00:00:00,000 --> 00:00:01,000\nHi.")
    assert "encdec: error: /audio/a.wav: its transcript files: is a directory" in capsys.readouterr().err
