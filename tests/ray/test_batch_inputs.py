"""The documents of a JSONL or Parquet input are checked before any work starts: each record needs
an id of its own and a text; the error names the bad lines (or rows). A document that is not
UTF-8 is its row's error, and so is an input the engine fails alone. No Ray job runs here."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")

from encdec.entrypoints.ray.batch import (alone_on_failure, audio_rows, document_rows, not_done,  # noqa: E402
                                          table_documents)


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_good_records_keep_their_order_and_integer_ids_become_strings(tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", [
        json.dumps({"id": "a", "text": "First."}), "", json.dumps({"id": 7, "text": "Second.", "x": 1})])
    assert table_documents(source) == [{"id": "a", "text": "First.", "error": ""},
                                       {"id": "7", "text": "Second.", "error": ""}]


def test_a_document_that_is_not_utf8_is_its_rows_error(tmp_path):
    table = tmp_path / "docs.jsonl"
    table.write_bytes(b'{"id": 1, "text": "Fine."}\n\n{"id": 2, "text": "Caf\xe9"}\n')
    assert document_rows([str(table)]) == [{"id": "1", "text": "Fine.", "error": ""},
                                           {"id": "2", "text": "", "error": "line 3: not UTF-8 text"}]
    (tmp_path / "good.txt").write_text("Fine.")
    (tmp_path / "latin1.txt").write_bytes(b"Caf\xe9 au lait")
    assert document_rows([str(tmp_path / "*.txt")]) == [
        {"id": str(tmp_path / "good.txt"), "text": "Fine.", "error": ""},
        {"id": str(tmp_path / "latin1.txt"), "text": "", "error": "not UTF-8 text"}]


def test_a_byte_order_mark_is_no_text(tmp_path):
    """Files saved by Windows' editors start with one: not part of the first id or text."""
    table = tmp_path / "docs.jsonl"
    table.write_bytes(b'\xef\xbb\xbf{"id": 1, "text": "Fine."}\n')
    (tmp_path / "marked.txt").write_bytes(b"\xef\xbb\xbfCaf\xc3\xa9.")
    assert document_rows([str(table)]) == [{"id": "1", "text": "Fine.", "error": ""}]
    assert document_rows([str(tmp_path / "marked.txt")]) == [
        {"id": str(tmp_path / "marked.txt"), "text": "Caf\u00e9.", "error": ""}]


def test_a_glob_matches_files_only(tmp_path):
    (tmp_path / "good.txt").write_text("Fine.")
    (tmp_path / "notes.txt").mkdir()  # a folder whose name the glob matches
    assert document_rows([str(tmp_path / "*.txt")]) == [{"id": str(tmp_path / "good.txt"), "text": "Fine.", "error": ""}]


def test_an_input_that_fails_alone_gets_its_error_and_the_others_their_results():
    """An engine's failure of one request (a RuntimeError such as NaN logits, or a refusal)
    fails that input's row, not its batch."""
    calls = []

    def run(items):
        calls.append(list(items))
        if "bad" in items:
            raise RuntimeError(f"prompt {items.index('bad')}: the logits hold NaN")
        return [item.upper() for item in items]

    results = alone_on_failure(run, ["a", "bad", "c"])
    assert results[0::2] == ["A", "C"] and isinstance(results[1], RuntimeError)
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert alone_on_failure(run, []) == []


def test_every_bad_record_is_named_by_its_line(tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", [
        json.dumps({"id": "a", "text": "Fine."}),
        json.dumps({"id": "b", "body": "no text field"}),
        json.dumps({"id": "c", "text": None}),
        json.dumps({"id": "d", "text": 123}),
        json.dumps({"text": "no id"}),
        json.dumps({"id": "a", "text": "the id of line 1 again"}),
        "{not json",
        json.dumps(["a", "list"]),
    ])
    with pytest.raises(ValueError) as err:
        table_documents(source)
    assert str(err.value) == (
        f"{source}: line 2: text must be a string, not null; line 3: text must be a string, not null; "
        "line 4: text must be a string, not 123; line 5: id must be a string or an integer, not null; "
        'line 6: id "a" again (first on line 1); and 2 more')


def test_parquet_rows_are_checked_the_same_way(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["One.", "Two."], "extra": [1, 2]}), good)
    assert table_documents(str(good)) == [{"id": "x", "text": "One.", "error": ""},
                                          {"id": "y", "text": "Two.", "error": ""}]
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.table({"id": ["x", "x"], "text": ["One.", None]}), twice)
    with pytest.raises(ValueError, match=r'row 2: id "x" again \(first on row 1\)$'):
        table_documents(str(twice))
    no_text = tmp_path / "no_text.parquet"
    pq.write_table(pa.table({"id": ["x"], "body": ["One."]}), no_text)
    with pytest.raises(ValueError, match=r"no_text.parquet: no text column \(it has id, body\)"):
        table_documents(str(no_text))


def test_finished_files_are_known_however_they_are_spelt(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "in")
    done = frozenset({str(tmp_path / "in" / "a.wav"), "in/b.wav"})
    assert not_done(["in/a.wav", "./in/a.wav", "link/a.wav", str(tmp_path / "in" / "b.wav"), "in/c.wav"],
                    done) == ["in/c.wav"]


def test_audio_inputs_are_each_file_once_with_an_absolute_path(tmp_path, monkeypatch):
    """However a file is named (twice, through a link, by a glob or a folder), it is one row; a
    link to nothing is a row in both (its error comes from the actor); an actor, which may work
    in another folder, gets the absolute path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    for name in ("a.wav", "b.wav"):
        (tmp_path / "in" / name).write_bytes(b"RIFF")
    (tmp_path / "in" / "gone.wav").symlink_to(tmp_path / "nowhere.wav")
    (tmp_path / "link").symlink_to(tmp_path / "in")
    rows = audio_rows(["in/b.wav", "./in/b.wav", "link/b.wav", "in/*.wav"])
    assert rows == [{"id": "in/b.wav", "path": str(tmp_path / "in" / "b.wav")},
                    {"id": "in/a.wav", "path": str(tmp_path / "in" / "a.wav")},
                    {"id": "in/gone.wav", "path": str(tmp_path / "in" / "gone.wav")}]
    assert [row["id"] for row in audio_rows(["in"])] == ["in/a.wav", "in/b.wav", "in/gone.wav"]
