"""`encdec batch` on a local Ray instance (2 CPUs, two actors at half a CPU each): 20 clips and
50 documents give the offline `LLM`'s results, each once; resuming skips finished inputs; an
actor killed mid-job is restarted and its batch retried, and every input still comes out once;
an input the engine refuses is its error row, and a job whose actors fail stops with the reason
on one line. (The same jobs on two nodes: test_ray_cluster.py.)"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from encdec.entrypoints.cli import main
from tests.ray.conftest import SMALL_CACHE, SUMMARY_TOKENS, init_ray, read_results

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

SUMMARY_OPTIONS = ["--temperature", "0", "--max-tokens", str(SUMMARY_TOKENS), *SMALL_CACHE]


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


def test_resume_skips_finished_inputs(tiny_bart_dir, documents, offline_summaries, tmp_path, capsys):
    """The second run computes only the new inputs and the one whose record the first run did not
    finish writing; an empty input and one that is not UTF-8 are error rows (exit 1)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc_id in list(documents)[:6]:
        (folder / f"{doc_id}.txt").write_text(documents[doc_id])
    out = tmp_path / "out"
    first = [str(folder / f"{doc_id}.txt") for doc_id in list(documents)[:3]]
    assert main(["batch", "summarize", *first, "--model", str(tiny_bart_dir), "--output", str(out),
                 *SUMMARY_OPTIONS]) == 0
    results = out / "results.jsonl"
    results.write_bytes(results.read_bytes()[:-40])  # the third record's write cut short
    (folder / "empty.txt").write_text(" \n")
    latin1 = folder / "latin1.txt"
    latin1.write_bytes(b"Caf\xe9 au lait.")
    long = folder / "long.txt"
    long.write_text(" ".join(documents.values()))  # past the encoder's 256 positions
    assert main(["batch", "summarize", str(folder), "--model", str(tiny_bart_dir), "--output", str(out),
                 *SUMMARY_OPTIONS]) == 1
    rows = read_results(out)
    assert [r["id"] for r in rows[:2]] == first[:2]
    assert sorted(r["id"] for r in rows) == sorted(str(p) for p in folder.glob("*.txt"))
    empty = str(folder / "empty.txt")
    assert {r["id"]: r["summary"] for r in rows if r["id"] not in (empty, str(latin1), str(long))} == {
        str(folder / f"{k}.txt"): offline_summaries[k] for k in list(documents)[:6]}
    assert [(r["id"], r["summary"], r["error"]) for r in rows if r["error"]] == [
        (empty, None, "the text to summarize is empty"), (str(latin1), None, "not UTF-8 text")]
    [cut] = [r for r in rows if r["truncated_tokens"]]
    assert (cut["id"], cut["input_tokens"]) == (str(long), 256) and cut["summary"]
    err = capsys.readouterr().err
    assert f"encdec: error: {empty}: the text to summarize is empty" in err
    assert f"encdec: error: {latin1}: not UTF-8 text" in err
    assert f"encdec: warning: {results}: dropped its incomplete last line" in err
    assert (f"encdec: warning: {results}: 2 results of an earlier run; their inputs are skipped "
            f"(another --output runs them again)") in err
    assert (f"encdec: note: {long}: cut to the model's limit of 256 input tokens "
            f"({cut['truncated_tokens']} tokens left out)") in err


def test_a_text_the_engine_refuses_is_its_error_row(tiny_bart_dir, documents, offline_summaries, tmp_path,
                                                    capsys):
    """Its KV cache can never fit the actor's: the other texts of its batch are summarized."""
    folder = tmp_path / "docs"
    folder.mkdir()
    short = list(documents)[:3]  # 26 to 60 tokens: 4 to 6 blocks
    for doc_id in short:
        (folder / f"{doc_id}.txt").write_text(documents[doc_id])
    long = folder / "long.txt"
    long.write_text(" ".join(documents.values()))  # cut to 256 tokens: 17 blocks
    out = tmp_path / "out"
    assert main(["batch", "summarize", str(folder), "--model", str(tiny_bart_dir), "--output", str(out),
                 "--temperature", "0", "--max-tokens", str(SUMMARY_TOKENS), "--num-gpu-blocks", "12",
                 "--swap-space", "0.01"]) == 1
    rows = {r["id"]: r for r in read_results(out)}
    assert {k: rows[str(folder / f"{k}.txt")]["summary"] for k in short} == {k: offline_summaries[k] for k in short}
    refused = ("encoder_prompt: the request needs 17 KV cache blocks (encoder 256 tokens, decoder up to 16 "
               "cached tokens, 1 sequence) but the cache has only num_gpu_blocks=12, less a watermark of 0 kept free")
    assert (rows[str(long)]["summary"], rows[str(long)]["error"]) == (None, refused)
    assert f"encdec: error: {long}: {refused}" in capsys.readouterr().err


def test_actors_that_fail_stop_the_job_with_the_reason_on_one_line(clip_paths, tmp_path, capsys):
    assert main(["batch", "transcribe", clip_paths[0], "--output", str(tmp_path), "--num-gpu-blocks", "1",
                 "--swap-space", "0.01"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (  # (Ray's own log lines above it)
        "encdec: error: ValueError: num_gpu_blocks=1: the KV cache cannot hold one Whisper window, whose 1500 "
        "encoder positions and 448 decoder positions need 122 blocks of 16 tokens")


def test_a_model_the_actors_cannot_read_is_named(tiny_bart_dir, documents, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bart_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(next(iter(documents.values())))
    assert main(["batch", "summarize", str(tmp_path / "docs"), "--model", str(broken), "--output",
                 str(tmp_path / "out"), "--swap-space", "0.01"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"encdec: error: RuntimeError: cannot load model {str(broken)!r}: ")


@pytest.mark.extended
def test_killed_actor_still_gives_each_input_once(tiny_bart_dir, documents, offline_summaries, tmp_path):
    from encdec.entrypoints.ray.batch import PoolOptions, summarize_dataset

    marker = tmp_path / "crashed"
    ds = ray.data.from_items([{"id": k, "text": v} for k, v in documents.items()], override_num_blocks=25)
    pool = PoolOptions(replicas=2, batch_size=2, crash_marker=str(marker),
                       llm_options=dict(num_gpu_blocks=600, swap_space=0.01))
    rows = summarize_dataset(ds, str(tiny_bart_dir), pool, temperature=0.0,
                             max_tokens=SUMMARY_TOKENS).take_all()
    assert marker.exists(), "no actor crashed"
    assert Counter(r["id"] for r in rows) == Counter(list(documents))
    assert {r["id"]: r["summary"] for r in rows} == offline_summaries


def test_transcribe_twenty_clips_locally(clip_paths, offline_transcripts, tmp_path, capsys):
    """`encdec batch transcribe` on the local instance: each clip once, the offline transcript,
    and its subtitles; a copy of a clip under the same name gets its text but not its files (an error row),
    a file that is not audio an error row (its name said once on stderr)."""
    copy = tmp_path / "other" / Path(clip_paths[0]).name
    copy.parent.mkdir()
    shutil.copy(clip_paths[0], copy)
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio")
    out = tmp_path / "out"
    assert main(["batch", "transcribe", *clip_paths, str(copy), str(bad), "--output", str(out), "--replicas", "2",
                 "--batch-size", "3", "--output-format", "srt", *SMALL_CACHE]) == 1
    rows = read_results(out)
    assert Counter(r["id"] for r in rows) == Counter([*clip_paths, str(copy), str(bad)])
    assert {r["id"]: r["text"] for r in rows} == {
        **offline_transcripts, str(copy): offline_transcripts[clip_paths[0]], str(bad): None}
    assert sorted(p.stem for p in out.glob("*.srt")) == sorted(Path(c).stem for c in clip_paths)
    errors = {r["id"]: r["error"] for r in rows if r["error"] is not None}
    assert sorted(errors) == sorted([str(copy), str(bad)])
    assert errors[str(copy)].startswith(f"its transcript files would overwrite those of {clip_paths[0]}")
    err = capsys.readouterr().err
    assert f"encdec: error: {copy}: its transcript files would overwrite those of {clip_paths[0]}" in err
    assert f"encdec: error: {bad}: not a readable audio file" in err and f"{bad}: {bad}" not in err


def test_summarize_fifty_documents_locally(documents_jsonl, tiny_bart_dir, offline_summaries, tmp_path):
    """`encdec batch summarize` on the local instance: each document once, the offline summary."""
    assert main(["batch", "summarize", str(documents_jsonl), "--model", str(tiny_bart_dir),
                 "--output", str(tmp_path), "--replicas", "2", "--batch-size", "4",
                 *SUMMARY_OPTIONS]) == 0
    rows = read_results(tmp_path)
    assert Counter(r["id"] for r in rows) == Counter(list(offline_summaries))
    assert {r["id"]: r["summary"] for r in rows} == offline_summaries
