"""`encdec batch` checks the model and its options on the driver: a bad value is a command-line
error (exit 2) before Ray starts, not a failure inside every actor."""
from __future__ import annotations

import pytest

from encdec.entrypoints.cli import main


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))


@pytest.mark.parametrize("job, options, message", [
    ("summarize", ["--min-tokens", "50", "--max-tokens", "10"],
     "--min-tokens must be <= --max-tokens=10, got 50"),
    ("summarize", ["--num-beams", "3", "--temperature", "0.5"],
     "--temperature must be 0 (or unset): beam search is deterministic, got 0.5"),
    ("summarize", ["--model", "/nonexistent/bart"], "--model /nonexistent/bart: no such directory"),
    ("transcribe", ["--language", "klingon"], "--language: 'klingon' is not a language Whisper knows"),
    ("transcribe", ["--model", "huge"], "--model 'huge' is neither a bundled Whisper model"),
])
def test_bad_options_stop_the_job_before_ray_starts(tiny_bart_dir, tmp_path, capsys, job, options, message):
    model = ["--model", str(tiny_bart_dir)] if job == "summarize" else []
    assert main(["batch", job, str(tmp_path), "--output", str(tmp_path / "out"), *model, *options]) == 2
    assert f"encdec: error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
