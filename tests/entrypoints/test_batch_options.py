"""`encdec batch` checks the model and its options on the driver: a bad value is a command-line
error (exit 2) before Ray starts, not a failure inside every actor."""
from __future__ import annotations

import shutil

import pytest

from encdec.entrypoints import cli_args
from encdec.entrypoints.cli import main
from encdec.weights.whisper_assets import resolve_whisper_model


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
    # against the checkpoint's lengths, as `encdec summarize` checks them (it sets no max_length)
    ("summarize", ["--min-tokens", "50"],
     "--min-tokens 50: the checkpoint's default max tokens is 20; set --max-tokens"),
    ("summarize", ["--max-tokens", "5000"],
     "--max-tokens=5000 is more than the decoder has room for: it holds 256 positions and the "
     "decoder prompt takes 1 token, so at most 256 (the last new token takes no position)"),
    ("transcribe", ["--language", "klingon"], "--language: 'klingon' is not a language Whisper knows"),
    ("transcribe", ["--model", "huge"], "--model 'huge' is neither a bundled Whisper model"),
])
def test_bad_options_stop_the_job_before_ray_starts(tiny_bart_dir, tmp_path, capsys, job, options, message):
    model = ["--model", str(tiny_bart_dir)] if job == "summarize" else []
    assert main(["batch", job, str(tmp_path), "--output", str(tmp_path / "out"), *model, *options]) == 2
    assert f"encdec: error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_model_summarize_refuses_stops_the_job_before_ray_starts(tiny_bart_dir, tmp_path, capsys):
    whisper = resolve_whisper_model("tiny.en").config_json.parent
    bare, broken = tmp_path / "bare", tmp_path / "broken"
    for folder, names in ((bare, ("config.json", "generation_config.json", "model.safetensors")),
                          (broken, ("tokenizer.json",))):
        folder.mkdir()
        for name in names:
            shutil.copy(tiny_bart_dir / name, folder / name)
    (broken / "config.json").write_text("{not JSON")
    unreadable = tmp_path / "unreadable"
    shutil.copytree(tiny_bart_dir, unreadable)
    (unreadable / "generation_config.json").write_text('{"num_beams":')
    for model, message in (
            (whisper, f"--model {whisper}: a Whisper checkpoint takes audio (batch summarize takes a "
                      f"text model such as BART, PEGASUS or T5; for speech use encdec transcribe)"),
            (bare, f"--model {bare}: the directory has no tokenizer files (tokenizer.json, or the "
                   f"tokenizer's own files), so text cannot be read"),
            (broken, f"cannot load model '{broken}': "),
            (unreadable, f"cannot load model '{unreadable}': generation_config.json is not valid JSON: ")):
        assert main(["batch", "summarize", str(tmp_path), "--model", str(model),
                     "--output", str(tmp_path / "out")]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"encdec: error: {message}")


def test_a_local_job_needs_the_device_on_this_machine(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli_args.torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(cli_args.torch.cuda, "is_available", lambda: False)
    job = ["batch", "transcribe", "x.wav", "--device", "cuda", "--output", str(tmp_path / "out")]
    assert main(job) == 2
    assert ("encdec batch transcribe: error: --device cuda: CUDA is not available on this machine"
            in capsys.readouterr().err)
    # on a cluster the actors' nodes have devices of their own: the job goes on, to its input
    assert main([*job, "--ray-address", "auto"]) == 1
    assert capsys.readouterr().err.splitlines() == ["encdec: error: x.wav: no such file or folder"]
