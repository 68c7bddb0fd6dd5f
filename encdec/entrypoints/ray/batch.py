"""Batch jobs on Ray Data: transcribe audio files and summarize documents on a pool of actors,
each holding one `LLM` built once (`map_batches` with a stateful class).

Input rows carry an `id`; output rows carry the same `id`, the result, an `error` (None when the
input succeeded) and the `node_id` of the Ray node that computed it. Results are what
`LLM.transcribe` / `LLM.generate` give for the same inputs. Ray Data restarts an actor that dies
(`max_restarts=-1`) and retries its batch (`max_task_retries=-1`), so each input still comes out
once. Actors take a fraction of a CPU by default: at one CPU each, actors on a small node leave
nothing to Ray Data's own tasks and the job stalls.

Audio inputs are paths that every node can read (a shared filesystem); documents are text files,
or a JSONL or Parquet file with `id` and `text` fields, read and checked by the driver (a
document it cannot read carries the reason in its row's `error`).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import ray
import torch

from encdec.audio import SAMPLE_RATE, load_audio
from encdec.entrypoints.cli_messages import os_reason
from encdec.entrypoints.summaries import prepare_article, summary_params
from encdec.llm import LLM

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".mp4", ".webm", ".aac", ".mpga")
TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = (".jsonl", ".json", ".parquet")
NOT_UTF8 = "not UTF-8 text"  # the error of a document that cannot be read as text


def expand_inputs(inputs: Sequence[str], suffixes: Sequence[str]) -> list[str]:
    """Files as given, the files with `suffixes` inside folders, and the files a glob matches; sorted within
    each folder or glob, a file named twice (however spelt) kept once. A name that matches
    nothing is a ValueError."""
    found: dict[str, str] = {}  # real path -> the first name given for it
    for name in inputs:
        if os.path.isdir(name):
            matches = sorted(str(p) for p in Path(name).iterdir() if p.suffix.lower() in suffixes)
        elif glob.has_magic(name):
            matches = sorted(match for match in glob.glob(name) if not os.path.isdir(match))
        elif os.path.exists(name):
            matches = [name]
        else:
            raise ValueError(f"{name}: no such file or folder")
        if not matches:
            raise ValueError(f"{name}: no input files (looked for {', '.join(suffixes)})")
        for match in matches:
            found.setdefault(os.path.realpath(match), match)
    return list(found.values())


def not_done(paths: list[str], done: frozenset[str]) -> list[str]:
    """`paths` less the files in `done`, however either names them (relative, absolute, links)."""
    finished = {os.path.realpath(name) for name in done}
    return [p for p in paths if os.path.realpath(p) not in finished]


def audio_rows(inputs: Sequence[str], done: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """Rows `{id, path}` for the audio files named by `inputs` (files, folders, globs); the id
    is the path as found, the path absolute (an actor on a cluster works in a folder of its
    own). Ids in `done` are left out."""
    return [{"id": p, "path": os.path.abspath(p)} for p in not_done(expand_inputs(inputs, AUDIO_SUFFIXES), done)]


def document_rows(inputs: Sequence[str], done: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """Rows `{id, text, error}`: of one JSONL or Parquet file with `id` and `text` fields
    (`table_documents`), or of text files (id: the path). `error` is "" unless the input cannot
    be read (text that is not UTF-8); its text is then "". Ids in `done` are left out."""
    paths = expand_inputs(inputs, TEXT_SUFFIXES)
    tables = [p for p in paths if p.lower().endswith(TABLE_SUFFIXES)]
    if tables and len(paths) > 1:
        raise ValueError(f"{tables[0]}: a JSONL or Parquet input must be the only one (it holds "
                         f"all the documents; the other inputs would be read as text)")
    if tables:
        return [row for row in table_documents(tables[0]) if row["id"] not in done]
    return [text_file_row(p) for p in not_done(paths, done)]


def text_file_row(path: str) -> dict[str, str]:
    """The `document_rows` row of one text file."""
    try:
        return {"id": path, "text": Path(path).read_text(encoding="utf-8-sig"), "error": ""}
    except UnicodeDecodeError:
        return {"id": path, "text": "", "error": NOT_UTF8}
    except OSError as err:
        return {"id": path, "text": "", "error": os_reason(err)}


def rows_dataset(rows: list[dict[str, Any]]) -> ray.data.Dataset:
    """A dataset of `rows`, a block each, so that every actor of the pool gets work."""
    return ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))


def audio_dataset(inputs: Sequence[str], done: frozenset[str] = frozenset()) -> ray.data.Dataset:
    """`audio_rows` as a dataset."""
    return rows_dataset(audio_rows(inputs, done))


def table_documents(source: str) -> list[dict[str, str]]:
    """The `{id, text, error}` rows of a JSONL or Parquet file, checked before any work starts, as
    OpenAI's Batch API checks its input file: each record needs an id (a string or an integer)
    of its own and a text (a string). A ValueError lists the first bad records by line (JSONL)
    or row. A JSONL line that is not UTF-8 is its row's error ("line N: not UTF-8 text")."""
    if source.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(source)
        missing = [name for name in ("id", "text") if name not in table.column_names]
        if missing:
            raise ValueError(f"{source}: no {' or '.join(missing)} column (it has {', '.join(table.column_names)})")
        records = [(f"row {n}", r, "") for n, r in enumerate(table.select(["id", "text"]).to_pylist(), 1)]
    else:
        with open(source, "rb") as file:
            records = [(f"line {n}", *_json_record(line)) for n, line in enumerate(file, 1) if line.strip()]
    rows, first_seen, problems = [], {}, []
    for where, record, unread in records:
        doc_id = record.get("id") if isinstance(record, dict) else None
        if not isinstance(record, dict):
            problems.append(f"{where}: not a JSON object")
        elif isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            problems.append(f"{where}: id must be a string or an integer, not {json.dumps(doc_id, default=str)}")
        elif str(doc_id) in first_seen:
            problems.append(f"{where}: id {json.dumps(str(doc_id))} again (first on {first_seen[str(doc_id)]})")
        elif not isinstance(record.get("text"), str):
            problems.append(f"{where}: text must be a string, not {json.dumps(record.get('text'), default=str)[:40]}")
        else:
            first_seen[str(doc_id)] = where
            rows.append({"id": str(doc_id), "text": "" if unread else record["text"],
                         "error": unread and f"{where}: {unread}"})
    if problems:
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise ValueError(f"{source}: {'; '.join(problems[:5])}{more}")
    if not rows:
        raise ValueError(f"{source}: no documents in it")
    return rows


def _json_record(line: bytes) -> tuple[Any, str]:
    """A JSONL line's record (None if it is not JSON), and "", or NOT_UTF8 for bytes that are
    not UTF-8 (the record is then read with replacement characters, for its id)."""
    try:
        text, unread = line.decode("utf-8-sig"), ""  # a byte-order mark (the first line's) is no text
    except UnicodeDecodeError:
        text, unread = line.decode("utf-8-sig", errors="replace"), NOT_UTF8
    try:
        return json.loads(text), unread
    except ValueError:
        return None, unread  # reported as "not a JSON object"


class _Worker:
    """One engine per actor; `crash_marker` is a test hook: the first actor to reach its second
    batch while that file does not exist creates it and exits, after computing the batch."""

    def __init__(self, model: str, llm_options: dict[str, Any], threads: int,
                 crash_marker: Optional[str]):
        torch.set_num_threads(threads)
        try:
            self.llm = LLM(model, **llm_options)
        except ValueError:
            raise  # a refusal, which names the option at fault
        except Exception as err:  # files that cannot be read: the job's error names the model
            raise RuntimeError(f"cannot load model {model!r}: {type(err).__name__}: {err}") from err
        self.node_id = ray.get_runtime_context().get_node_id()
        self.crash_marker, self.calls = crash_marker, 0

    def finish(self, batch: dict[str, np.ndarray], results: dict[str, list]) -> dict[str, list]:
        self.calls += 1
        if self.crash_marker and self.calls == 2:
            try:
                os.close(os.open(self.crash_marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return {"id": [str(i) for i in batch["id"]], **results, "node_id": [self.node_id] * len(batch["id"])}


class Transcriber(_Worker):
    """`LLM.transcribe` over a batch of audio paths."""

    def __init__(self, model: str, llm_options: dict[str, Any], threads: int,
                 transcribe_options: dict[str, Any], crash_marker: Optional[str] = None):
        super().__init__(model, llm_options, threads, crash_marker)
        self.options = transcribe_options

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        loaded, errors = {}, [None] * len(batch["path"])
        for i, path in enumerate(batch["path"]):
            try:
                loaded[i] = (load_audio(str(path), allow_empty=True), SAMPLE_RATE)
            except (ValueError, OSError) as err:
                errors[i] = str(err)
        transcribed = alone_on_failure(lambda audios: self.llm.transcribe(audios, **self.options),
                                       list(loaded.values()))
        results = {}
        for i, result in zip(loaded, transcribed):
            if isinstance(result, Exception):
                errors[i] = str(result)
            else:
                results[i] = result
        text, language, duration, segments = [], [], [], []
        for i in range(len(errors)):
            result = results.get(i)
            text.append(result.text if result else None)
            language.append(result.language if result else None)
            duration.append(result.duration if result else None)
            segments.append(json.dumps([dataclasses.asdict(s) for s in result.segments]) if result else None)
        return self.finish(batch, dict(text=text, language=language, duration=duration,
                                       segments=segments, error=errors))


class Summarizer(_Worker):
    """`LLM.generate` over a batch of documents, decoding as `encdec summarize` does."""

    def __init__(self, model: str, llm_options: dict[str, Any], threads: int,
                 decoding: dict[str, Any], truncate: bool, crash_marker: Optional[str] = None):
        super().__init__(model, llm_options, threads, crash_marker)
        engine = self.llm.llm_engine
        self.params = summary_params(engine.generation_defaults, **decoding)
        self.limit, self.truncate = engine.model_config.max_encoder_len, truncate

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        engine = self.llm.llm_engine
        unread = batch.get("error", [""] * len(batch["text"]))  # the driver's reasons, if any
        articles, errors = {}, [str(reason) or None for reason in unread]
        for i, text in enumerate(batch["text"]):
            if errors[i] is not None:
                continue
            try:
                articles[i] = prepare_article(str(text), engine.tokenizer, engine.model_config.hf_config,
                                              self.limit, self.truncate)
            except ValueError as err:
                errors[i] = str(err)
        summaries = {}
        start = engine.model_config.decoder_start_token_id
        summarized = alone_on_failure(self.summaries, [article.prompt(start) for article in articles.values()])
        for i, summary in zip(articles, summarized):
            if isinstance(summary, str):
                summaries[i] = summary
            else:
                errors[i] = str(summary)
        done = [articles.get(i) for i in range(len(errors))]
        return self.finish(batch, dict(
            summary=[summaries.get(i) for i in range(len(errors))],
            input_tokens=[len(a.token_ids) if a else None for a in done],
            truncated_tokens=[a.truncated_tokens if a else None for a in done], error=errors))

    def summaries(self, prompts: list[dict]) -> list[str]:
        return [out.outputs[0].text.strip() for out in self.llm.generate(prompts, self.params, use_tqdm=False)]


def alone_on_failure(run: Callable[[list], list], items: list) -> list[Any]:
    """`run(items)`, the items decoded together; if that raises a ValueError or RuntimeError
    (the engine refused one request, such as a text whose KV cache can never fit, or one failed),
    `run` on each item alone, so that only the items that fail alone get their error in place
    of a result (the engine's own, without "prompt 0: ")."""
    if not items:
        return []
    try:
        return run(items)
    except (ValueError, RuntimeError) as err:
        if len(items) == 1:
            return [err.__cause__ or err]
        return [result for item in items for result in alone_on_failure(run, [item])]


@dataclasses.dataclass
class PoolOptions:
    """The actor pool: `replicas` actors of `cpus` CPUs each (torch threads: the whole CPUs,
    at least one), `batch_size` rows per call, `llm_options` for each actor's `LLM`."""

    replicas: int = 1
    cpus: float = 0.5
    batch_size: int = 4
    llm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    crash_marker: Optional[str] = None  # test hook: see `_Worker`


def _run_on_pool(ds: ray.data.Dataset, worker: type, model: str, pool: PoolOptions,
                 **options: Any) -> ray.data.Dataset:
    kwargs = dict(model=model, llm_options=pool.llm_options, threads=max(1, math.floor(pool.cpus)),
                  crash_marker=pool.crash_marker, **options)
    return ds.map_batches(worker, fn_constructor_kwargs=kwargs, batch_size=pool.batch_size,
                          batch_format="numpy", num_cpus=pool.cpus,
                          compute=ray.data.ActorPoolStrategy(size=pool.replicas))


def transcribe_dataset(ds: ray.data.Dataset, model: str, pool: PoolOptions = PoolOptions(),
                       **transcribe_options: Any) -> ray.data.Dataset:
    """Rows `{id, path}` -> `{id, text, language, duration, segments (JSON), error, node_id}`;
    `transcribe_options` go to `LLM.transcribe` (language, task, timestamps, ...)."""
    return _run_on_pool(ds, Transcriber, model, pool, transcribe_options=transcribe_options)


def summarize_dataset(ds: ray.data.Dataset, model: str, pool: PoolOptions = PoolOptions(),
                      truncate: bool = True, **decoding: Any) -> ray.data.Dataset:
    """Rows `{id, text}` (with `error`, a reason the driver could not read the text: that row's
    error unless "") -> `{id, summary, input_tokens, truncated_tokens, error, node_id}`; texts
    over the model's input limit are cut to fit (an error with `truncate=False`), and
    `truncated_tokens` says how many tokens were left out; `decoding`: the options of `encdec
    summarize` (max_tokens, num_beams, temperature, ...), unset ones from the checkpoint's
    generation config."""
    return _run_on_pool(ds, Summarizer, model, pool, decoding=decoding, truncate=truncate)
