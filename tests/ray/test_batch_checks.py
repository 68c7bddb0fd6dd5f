"""What `encdec batch` checks on the driver before its job starts: a bad output folder, model,
option or input is one line that names it (no traceback, no output folder left behind), and
actors that need more CPUs than the local Ray instance has are refused instead of waiting
forever. Only the last test starts Ray."""
from __future__ import annotations

import json
import os

import pytest

from encdec.entrypoints.cli import main
from encdec.weights.loader import whisper_multilingual

ray = pytest.importorskip("ray")


def batch(capsys, *args: str) -> tuple[int, str]:
    status = main(["batch", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def test_an_output_that_is_a_file_is_a_usage_error(tiny_bart_dir, tmp_path, capsys):
    doc = tmp_path / "a.txt"
    doc.write_text("Some text.")
    taken = tmp_path / "taken"
    taken.write_text("")
    status, err = batch(capsys, "summarize", str(doc), "--model", str(tiny_bart_dir),
                        "--output", str(taken))
    assert status == 2 and f"error: --output {taken}: not a directory" in err


def test_a_table_input_must_be_alone_and_hold_documents(tiny_bart_dir, tmp_path, capsys):
    doc, table, empty, out = (tmp_path / name for name in ("a.txt", "docs.jsonl", "none.jsonl", "out"))
    doc.write_text("Some text.")
    table.write_text(json.dumps({"id": "x", "text": "Other text."}) + "\n")
    empty.write_text("\n")
    for inputs, message in (([table, doc], f"{table}: a JSONL or Parquet input must be the only one"),
                            ([empty], f"{empty}: no documents in it")):
        status, err = batch(capsys, "summarize", *map(str, inputs), "--model", str(tiny_bart_dir),
                            "--output", str(out))
        assert status == 1 and f"encdec: error: {message}" in err
    assert not out.exists()


def test_the_kv_cache_space_must_be_positive(tmp_path, capsys):
    status, err = batch(capsys, "transcribe", "x.wav", "--output", str(tmp_path), "--kv-cache-space", "0")
    assert status == 2 and "argument --kv-cache-space: expected a finite number > 0, got '0'" in err


def test_an_english_only_model_refuses_translate_and_transcribes_english(tmp_path, capsys):
    missing = tmp_path / "missing.wav"
    status, err = batch(capsys, "transcribe", str(missing), "--task", "translate",
                        "--output", str(tmp_path / "out"))
    assert status == 2 and "--task translate needs a multilingual model; tiny.en is English-only" in err
    status, err = batch(capsys, "transcribe", str(missing), "--language", "German",
                        "--output", str(tmp_path / "out"))
    assert status == 1  # past the model's checks, to the missing input
    assert ("encdec: warning: tiny.en is an English-only model: it cannot transcribe German and "
            "writes all speech as English") in err
    assert f"encdec: error: {missing}: no such file or folder" in err


def test_a_whisper_models_languages_are_told_without_its_weights(tiny_bart_dir, tmp_path, capsys):
    assert whisper_multilingual("tiny.en") is False
    for size, generation, multilingual in ((51865, {}, True), (51864, {}, False),
                                           (51864, {"is_multilingual": True}, True)):
        folder = tmp_path / f"{size}{generation}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "vocab_size": size}))
        (folder / "generation_config.json").write_text(json.dumps(generation))
        assert whisper_multilingual(str(folder)) is multilingual
    status, err = batch(capsys, "transcribe", "x.wav", "--model", str(tiny_bart_dir),
                        "--output", str(tmp_path / "out"))
    assert status == 2
    assert f"--model {tiny_bart_dir}: not a Whisper model (its config.json says model_type 'bart')" in err


@pytest.mark.ray
def test_actors_that_cannot_fit_the_local_instance_are_refused(tmp_path, capsys, monkeypatch):
    """Without --ray-address the job starts a local instance: not the cluster RAY_ADDRESS (or a
    `ray start` that has since died) names, which it would wait for."""
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.2:6390")  # no cluster answers there
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"")  # never read: the job stops before it
    cpus = os.cpu_count()
    status, err = batch(capsys, "transcribe", str(clip), "--output", str(tmp_path / "out"),
                        "--replicas", str(cpus + 1), "--cpus-per-replica", "1")
    assert status == 2 and not ray.is_initialized()
    assert not (tmp_path / "out").exists()
    assert (f"--replicas {cpus + 1} x --cpus-per-replica 1 need {cpus + 1} CPUs; the Ray cluster "
            f"has {cpus} (the job could never start)") in err
