"""`encdec batch transcribe | summarize`: a batch job on Ray Data (`encdec.entrypoints.ray.batch`).

Results go to `OUTPUT/results.jsonl`, one line per input as it finishes; a run over the same
OUTPUT skips the inputs already there (resumable), and no id is written twice. `transcribe`
can also write each transcript's files (`--output-format`). Without `--ray-address` the job
starts a local Ray instance; inside a running Ray session (a test) it uses that one.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from encdec.entrypoints.ray.cluster import RayNotStarted, root_cause, start_ray, unschedulable

RESULTS = "results.jsonl"
ACTOR_ENGINE_OPTIONS = ("dtype", "device", "quantization", "num_gpu_blocks", "kv_cache_space",
                        "swap_space")  # the options that go to each actor's LLM
BATCH_EPILOG = """\
Each input comes out once in OUTPUT/results.jsonl with its id ({id}), {result}, "error" (null
unless it failed) and the Ray node that computed it. Inputs already in that file are skipped, so
an interrupted job resumes where it stopped. Exit status: 2 for bad options or a model that
cannot do the job (checked before Ray starts), 1 if any input failed or the inputs could not be
listed, 0 otherwise.
"""


def add_batch(subparsers) -> None:
    """The `batch` command and its `transcribe` and `summarize` subcommands."""
    from encdec.entrypoints.cli_args import add_model_options
    from encdec.entrypoints.summarize_cli import add_decoding_options
    from encdec.entrypoints.transcribe_args import non_negative_float, positive_float, positive_int
    from encdec.whisper.writers import FORMATS

    batch = subparsers.add_parser("batch", help="batch jobs on a Ray cluster (Ray Data; the ray extra)",
                                  description="Transcribe or summarize many inputs on a Ray cluster, "
                                              "one engine per actor.")
    jobs = batch.add_subparsers(dest="job", title="jobs", required=True)
    transcribe = jobs.add_parser(
        "transcribe", help="transcribe audio files with Whisper",
        description="Transcribe (or translate into English) audio files on a Ray cluster, one Whisper "
                    "engine per actor.",
        epilog=BATCH_EPILOG.format(id="the file's path", result='its "text", "language", "duration" and '
                                   '"segments"'))
    transcribe.add_argument("inputs", nargs="+", metavar="INPUT",
                            help="audio files, folders of them, or globs (paths every node can read)")
    transcribe.add_argument("--model", default="tiny.en", help="Whisper alias or checkpoint directory "
                                                               "(default: tiny.en)")
    transcribe.add_argument("--language", default=None, help="language code (default: detect)")
    transcribe.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                            help="transcribe, or translate the speech into English (default: transcribe)")
    transcribe.add_argument("--timestamps", action=argparse.BooleanOptionalAction, default=True,
                            help="predict segment timestamps (default: on)")
    transcribe.add_argument("--output-format", choices=[*FORMATS, "all"], default=None,
                            help="also write each transcript as OUTPUT/BASENAME.EXT (default: none)")
    summarize = jobs.add_parser(
        "summarize", help="summarize documents with a text checkpoint (BART, T5, PEGASUS, ...)",
        description="Summarize documents on a Ray cluster, one engine per actor, decoding as "
                    "`encdec summarize` does.",
        epilog=BATCH_EPILOG.format(id="the text file's path, or the JSONL/Parquet id as a string",
                                   result='its "summary", "input_tokens" and "truncated_tokens"'))
    summarize.add_argument("inputs", nargs="+", metavar="INPUT",
                           help="text files, folders of them or globs; or one JSONL or Parquet file "
                                "with id and text columns")
    summarize.add_argument("--model", required=True, metavar="DIR", help="local checkpoint directory")
    add_decoding_options(summarize)
    for job in (transcribe, summarize):
        job.add_argument("--output", required=True, metavar="OUTPUT", help="output directory")
        job.add_argument("--ray-address", default=None,
                         help="Ray cluster to join (auto: the one started with `ray start`; "
                              "default: a local instance)")
        job.add_argument("--replicas", type=positive_int, default=1, help="actors, each with one engine "
                                                                          "(default: 1)")
        job.add_argument("--cpus-per-replica", type=non_negative_float, default=0.5,
                         help="CPUs Ray reserves per actor; keep some for Ray Data's own tasks (default: 0.5)")
        job.add_argument("--batch-size", type=positive_int, default=4,
                         help="inputs per engine call (default: 4)")
        job.add_argument("--num-gpu-blocks", type=positive_int, default=None,
                         help="KV cache blocks per actor (default: from --kv-cache-space)")
        job.add_argument("--kv-cache-space", type=positive_float, default=2.0,
                         help="KV cache memory per actor in GiB (default: 2)")
        job.add_argument("--swap-space", type=non_negative_float, default=1.0,
                         help="swap space per actor in GiB (default: 1)")
        add_model_options(job)
        job.set_defaults(handler=run_batch)


def result_id(line: str) -> str | None:
    """The id of one results.jsonl line, or None if it is not a whole record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("id") if isinstance(record, dict) else None


def done_ids(path: Path) -> set[str]:
    """The ids already in a results file (none if it does not exist), after mending its end for
    the next run's appends: a last record without its newline gets one; a last line cut off
    mid-write (a killed job) is dropped with a warning, so its input runs again. Any other line
    that is not a record is a ValueError naming it."""
    from encdec.entrypoints.cli_messages import warn

    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        if result_id(data[cut:].decode("utf-8", errors="replace")) is None:
            with open(path, "r+b") as file:
                file.truncate(cut)
            data = data[:cut]
            warn(f"{path}: dropped its incomplete last line (a write cut short); that input runs again")
        else:
            with open(path, "ab") as file:
                file.write(b"\n")
    ids = set()
    for number, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
        if line.strip():
            if (record_id := result_id(line)) is None:
                raise ValueError(f"{path}, line {number}: not a result record of encdec batch "
                                 f"(choose another --output, or mend or remove that file)")
            ids.add(record_id)
    return ids


def input_rows(args: argparse.Namespace, done: frozenset[str]) -> list[dict[str, str]]:
    """The inputs the arguments name, less those in `done`, read and checked (ValueError,
    OSError)."""
    from encdec.entrypoints.ray import batch

    read = batch.audio_rows if args.job == "transcribe" else batch.document_rows
    return read(args.inputs, done)


def job_dataset(args: argparse.Namespace, inputs):
    """The results of the job the arguments describe, over the `inputs` dataset."""
    from encdec.entrypoints.ray import batch
    from encdec.entrypoints.summarize_cli import decoding_options

    pool = batch.PoolOptions(replicas=args.replicas, cpus=args.cpus_per_replica,
                             batch_size=args.batch_size,
                             llm_options={name: getattr(args, name) for name in ACTOR_ENGINE_OPTIONS})
    if args.job == "transcribe":
        return batch.transcribe_dataset(inputs, args.model, pool, language=args.language,
                                        task=args.task, timestamps=args.timestamps)
    return batch.summarize_dataset(inputs, args.model, pool, truncate=args.truncate,
                                   **decoding_options(args))


def output_record(row: dict[str, Any]) -> dict[str, Any]:
    """A result row as a JSON object (transcript segments as a list, not a JSON string)."""
    record = {key: value.item() if hasattr(value, "item") else value for key, value in row.items()}
    if isinstance(record.get("segments"), str):
        record["segments"] = json.loads(record["segments"])
    return record


def write_transcript_files(record: dict[str, Any], output: Path, fmt: str) -> None:
    from encdec.whisper.transcript import Segment, Transcription, Word
    from encdec.whisper.writers import write_result

    segments = [Segment(**{**s, "words": [Word(**w) for w in s["words"]]}) for s in record["segments"]]
    write_result(Transcription(record["text"], record["language"], segments, record["duration"],
                               source=record["id"]), output, fmt)


def write_results(rows, args: argparse.Namespace, done: set[str], total: int) -> int:
    """Append each new row to OUTPUT/results.jsonl (and its transcript files, first: a row whose
    files cannot be written carries why in its `error`); returns failures."""
    from encdec.entrypoints.cli_messages import input_error, os_reason
    from encdec.entrypoints.summarize_cli import cut_note
    from encdec.whisper.writers import source_basename

    output, failed, output_format = Path(args.output), 0, getattr(args, "output_format", None)
    owners = {source_basename(done_id): done_id for done_id in sorted(done)} if output_format else {}
    with open(output / RESULTS, "a", encoding="utf-8") as file, \
            tqdm(total=total, desc=args.job, unit="input", file=sys.stderr) as bar:
        for row in rows:
            record = output_record(row)
            if record["id"] in done:
                continue
            done.add(record["id"])
            if record["error"] is None and output_format:  # its input's name, first come
                owner = owners.setdefault(source_basename(record["id"]), record["id"])
                if owner != record["id"]:
                    record["error"] = (f"its transcript files would overwrite those of {owner} (same name "
                                       f"{source_basename(owner)!r}); not written (the text is in {RESULTS})")
                else:
                    try:
                        write_transcript_files(record, output, output_format)
                    except OSError as err:
                        record["error"] = f"its transcript files: {os_reason(err)}"
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
            file.flush()
            bar.update(1)
            if record["error"] is not None:
                input_error(record["id"], record["error"])
                failed += 1
            elif record.get("truncated_tokens"):
                cut_note(record["id"], record["input_tokens"], record["truncated_tokens"])
    return failed


def check_job(args: argparse.Namespace) -> None:
    """Check the model and the options on the driver, before any actor starts (ValueError worded
    for the command line)."""
    from encdec.entrypoints.transcribe_cli import check_english_only
    from encdec.entrypoints.summaries import Article
    from encdec.entrypoints.summarize_cli import check_output_lengths, check_text_model, decoding_params
    from encdec.generation_config import load_generation_defaults
    from encdec.weights.loader import (check_model, checkpoint_dir_problem, decoder_positions,
                                       whisper_multilingual)
    from encdec.whisper.languages import requested_language

    if args.job == "transcribe":
        args.language = requested_language(args.language, "--language")
        check_model(args.model, "--model")
        multilingual = whisper_multilingual(args.model, "--model")
        if multilingual is not None:
            check_english_only(args, multilingual)
        return
    problem = checkpoint_dir_problem(Path(args.model).expanduser())
    if problem:
        raise ValueError(f"--model {args.model}: {problem} (batch summarize takes a local Hugging "
                         f"Face checkpoint directory)")
    check_text_model(args.model, "batch summarize")
    try:
        positions = decoder_positions(args.model)
    except (ValueError, OSError) as err:  # as `encdec summarize` words a model it cannot load
        raise ValueError(f"cannot load model {args.model!r}: {err}") from None
    defaults = load_generation_defaults(args.model)
    check_output_lengths(defaults, Article.DECODER_PROMPT_LEN, positions, decoding_params(defaults, args),
                         args.min_tokens)


def run_batch(args: argparse.Namespace) -> int:
    from encdec.entrypoints.cli_args import make_output_dir
    from encdec.entrypoints.cli_messages import INSTALL_RAY, error, warn

    try:
        check_job(args)
        done = done_ids(Path(args.output) / RESULTS)
    except ValueError as err:
        error(str(err))
        return 2
    try:
        import ray

        from encdec.entrypoints.ray.batch import rows_dataset
    except ImportError:
        error(f"batch jobs need Ray: {INSTALL_RAY}")
        return 1
    try:
        rows = input_rows(args, frozenset(done))
    except (ValueError, OSError) as err:
        error(str(err))
        return 1
    created = not Path(args.output).exists()
    make_output_dir(args.output, "--output")
    if done:
        warn(f"{Path(args.output) / RESULTS}: {len(done)} results of an earlier run; their inputs "
             f"are skipped (another --output runs them again)")
    if not rows:
        return 0
    started = not ray.is_initialized()
    if started:
        try:
            start_ray(args.ray_address, logging_level=logging.WARNING)
        except RayNotStarted as err:
            error(str(err))
            return 1
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        problem = unschedulable(args.replicas, args.cpus_per_replica, f"--replicas {args.replicas}")
        if problem and started and args.ray_address is None:
            error(f"{problem} (the job could never start)")
            if created:
                Path(args.output).rmdir()  # a refused job leaves nothing behind
            return 2
        if problem:
            warn(f"{problem}: the job waits until it has them")
        results = job_dataset(args, rows_dataset(rows)).iter_rows()
        return 1 if write_results(results, args, done, len(rows)) else 0
    except ray.exceptions.RayError as err:  # actors that failed (the results so far are kept)
        error(root_cause(str(err)))
        return 1
    finally:
        if started:
            ray.shutdown()
