"""The HTTP server under 1, 8 and 32 concurrent clients, against what users run today.

Two tasks, each against its own baseline, every server in its own process on loopback:

* summarize: `encdec serve` (`/v1/summarize`) vs a plain FastAPI app around Hugging Face's
  summarization pipeline (transformers 5 removed it: the app runs its steps, tokenize with
  truncation, `generate()`, decode). One seeded random-weight checkpoint of the facebook/bart-base shape
  (a 1000-token BPE vocabulary trained on the tests' corpus, DEEP_INIT_STDS weights), articles
  of 150-400 tokens, exactly 64 generated tokens per summary (min = max), greedy.
* transcribe: `encdec serve` (`/v1/audio/transcriptions`) vs a FastAPI app around
  faster-whisper's `WhisperModel` (temperature fallback: its defaults, except the beam size:
  `--beam-size`, 1 by default as OpenAI's API decodes; 5 is faster-whisper's default),
  both in `--compute-type`: float32, int8 (encdec's `--quantization int8`) or bfloat16
  (encdec's `--dtype bfloat16`; faster-whisper in bfloat16 where CTranslate2 runs it on this
  CPU, else in float32, its only float type here). The bundled tiny.en weights for both;
  espeak-ng clips of 4-12 s.

The baselines serve one request at a time (a lock around the model), as such wrappers and
whisper.cpp's server do. Each client sends its next request when the last one is answered;
a level sends a bounded number of requests (`--requests`: 6, 24, 64 at 1, 8, 32 clients).
Reported: requests/s over the level's wall time, p50 / p95 latency, and how the baseline's
answers match encdec's at the same level (the share identical; for transcripts also the WER
of encdec's against faster-whisper's). Summaries should match exactly: a WARNING says where
they do not. The checkpoint is made once in `--work-dir` (the clips are spoken there each run).

    python -m benchmarks.bench_serve [--threads 2] [--tasks summarize,transcribe]
        [--compute-type float32|bfloat16|int8] [--beam-size 1] [--max-running-requests auto]
        [--requests 6,24,64] [--work-dir ~/.cache/encdec-bench/serve]
        [--out benchmarks/results/serve.json]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from fastapi import File, Form, UploadFile  # at module level: the route's annotations name them

from benchmarks.common import (POSITIVE, RESULTS, machine, markdown_table, names, nonempty_list,
                               prefix_agreement, script_parser, write_json)
from encdec.entrypoints.serve_cli import positive_int_or_auto
from encdec.entrypoints.transcribe_args import number
from tests.entrypoints.remote_server import free_port
from tests.speech_corpus import wer

CLIENTS = (1, 8, 32)  # concurrent clients of each level
SUMMARY_TOKENS = 64  # bart-large-cnn summarizes in 56-142 tokens


# ----------------------------------------------------------------------------- inputs


def make_checkpoint(out: Path) -> Path:
    from tests.bart_checkpoints import BART_BASE, DEEP_INIT_STDS, make_bart_checkpoint

    if not (out / "tokenizer_config.json").exists():  # written last: a build that stopped is made again
        shape = {k: v for k, v in BART_BASE.items() if k != "vocab_size"}
        make_bart_checkpoint(out, seed=0, init_stds=DEEP_INIT_STDS, **shape)
    return out


def make_articles(count: int) -> list[str]:
    """Articles of 150-400 tokens built from the tests' corpus sentences."""
    from tests.bart_checkpoints import CORPUS

    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(CORPUS, size=int(rng.integers(8, 22)))) for _ in range(count)]


def make_clips(folder: Path, count: int) -> list[Path]:
    """Clips of 4-12 s: two to four sentences of the speech corpus."""
    import soundfile

    from tests.speech_corpus import CORPUS, speak

    folder.mkdir(parents=True, exist_ok=True)
    sentences = [speak(folder, f"s{i}", voice, speed, text) for i, (voice, speed, text) in enumerate(CORPUS)]
    pause = np.zeros(16000 // 3, dtype=np.float32)
    clips = []
    for i in range(count):
        picked = [sentences[(i * 3 + j * 7) % len(sentences)] for j in range(2 + i % 3)]
        path = folder / f"clip{i}.wav"
        soundfile.write(path, np.concatenate([np.concatenate([s, pause]) for s in picked]), 16000)
        clips.append(path)
    return clips


def tiny_en_dir() -> str:
    from encdec.weights.whisper_assets import resolve_whisper_model

    return str(resolve_whisper_model("tiny.en").bin_parts[0].parent)


# ----------------------------------------------------------------------------- baseline servers


def faster_whisper_compute_type(requested: str) -> str:
    """`requested` if CTranslate2 runs it on this CPU, else float32."""
    import ctranslate2

    return requested if requested in ctranslate2.get_supported_compute_types("cpu") else "float32"


def baseline_app(kind: str, model: str, threads: int, compute_type: str, beam_size: int):
    """A plain FastAPI app around one Hugging Face or faster-whisper model, one request at a time."""
    import threading

    import torch
    from fastapi import FastAPI
    from fastapi.concurrency import run_in_threadpool

    torch.set_num_threads(threads)
    lock = threading.Lock()
    app = FastAPI()
    if kind == "hf":
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        seq2seq = AutoModelForSeq2SeqLM.from_pretrained(model).eval()

        @app.post("/v1/summarize")
        def summarize(body: dict) -> dict:
            # the steps of transformers 4's summarization pipeline (removed in transformers 5)
            with lock, torch.inference_mode():
                inputs = tokenizer(body["input"], truncation=True, return_tensors="pt")
                ids = seq2seq.generate(**inputs, max_new_tokens=body["max_tokens"],
                                       min_new_tokens=body["min_tokens"], num_beams=1, do_sample=False)
            text = tokenizer.decode(ids[0], skip_special_tokens=True, clean_up_tokenization_spaces=False)
            return {"summaries": [{"index": 0, "text": text}]}
    else:
        from faster_whisper import WhisperModel

        whisper = WhisperModel(model, device="cpu", compute_type=faster_whisper_compute_type(compute_type),
                               cpu_threads=threads)

        def run(path: str) -> str:
            with lock:
                segments, _ = whisper.transcribe(path, beam_size=beam_size, language="en")
                return "".join(s.text for s in segments).strip()

        @app.post("/v1/audio/transcriptions")
        async def transcribe(file: UploadFile = File(...), model: str = Form(...)) -> dict:
            with tempfile.NamedTemporaryFile(suffix=".wav") as tmp:
                tmp.write(await file.read())
                tmp.flush()
                return {"text": await run_in_threadpool(run, tmp.name)}
    return app


def serve_baseline(kind: str, model: str, port: int, threads: int, compute_type: str, beam_size: int) -> None:
    import uvicorn

    uvicorn.run(baseline_app(kind, model, threads, compute_type, beam_size), host="127.0.0.1", port=port,
                log_level="warning")


# ----------------------------------------------------------------------------- driving


def start(command: list[str], port: int, threads: int) -> subprocess.Popen:
    """A server, once it answers (killed if it does not, or if the driver is stopped first)."""
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "NUMBA_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{command} exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=2)
                return proc
            except httpx.TransportError:
                time.sleep(0.5)
        raise RuntimeError(f"{command} did not start")
    except BaseException:
        proc.kill()
        proc.wait()
        raise


async def request(http, task: str, item, fields: dict) -> tuple[float, str]:
    """One request's latency and answer; `fields` are the body's fields besides the input."""
    start = time.perf_counter()
    if task == "summarize":
        response = await http.post("/v1/summarize", json={**fields, "input": item})
    else:
        response = await http.post("/v1/audio/transcriptions", data=fields,
                                   files={"file": (item.name, item.read_bytes(), "audio/wav")})
    response.raise_for_status()
    answer = response.json()
    text = answer["summaries"][0]["text"] if task == "summarize" else answer["text"]
    return time.perf_counter() - start, text


async def level(url: str, task: str, items: list, fields: dict, clients: int, count: int) -> dict:
    """`count` requests from `clients` concurrent clients (each waits for its last answer), and
    the answer to each item sent (by its index)."""
    import httpx

    queue = list(range(count))
    latencies, outputs = [], {}

    async def client(http) -> None:
        while queue:
            i = queue.pop() % len(items)
            latency, outputs[i] = await request(http, task, items[i], fields)
            latencies.append(latency)

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
        await request(http, task, items[0], fields)  # warm-up, not counted
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=20)
    return {"clients": clients, "requests": count, "wall_s": wall, "req_per_s": count / wall,
            "p50_s": statistics.median(latencies), "p95_s": cuts[18], "outputs": outputs}


def agreement(task: str, ours: dict[int, str], theirs: dict[int, str]) -> dict:
    """How a baseline's answers match encdec's for the items both were sent: the share
    identical; for summaries also the share of the baseline's words before the first divergence
    (as bench_bart's tokens), for transcripts the WER of encdec's against the baseline's."""
    sent = sorted(ours.keys() & theirs.keys())
    mine, base = [ours[i] for i in sent], [theirs[i] for i in sent]
    result = {"compared": len(sent), "identical": sum(a == b for a, b in zip(mine, base)) / len(sent)}
    if task == "summarize":
        result["words_before_divergence"] = prefix_agreement([t.split() for t in mine],
                                                             [t.split() for t in base])
    else:
        result["wer"] = wer(base, mine)
    return result


def agreement_cell(vs_encdec: dict | None) -> str:
    if vs_encdec is None:
        return "-"
    cell = f"{vs_encdec['identical']:.0%} identical"
    return cell + (f", WER {vs_encdec['wer']:.1%}" if "wer" in vs_encdec else "")


def measure(name: str, compute_type: str, command: list[str], port: int, task: str, items: list,
            fields: dict, threads: int, requests: list[int], log) -> list[dict]:
    proc = start(command, port, threads)
    try:
        rows = []
        for clients, count in zip(CLIENTS, requests):
            load = os.getloadavg()[0]
            row = asyncio.run(level(f"http://127.0.0.1:{port}", task, items, fields, clients, count))
            row.update(system=name, compute_type=compute_type, task=task, load_before=load,
                       load_after=os.getloadavg()[0])
            log(f"{name} ({compute_type}) {task} x{clients}: {row['req_per_s']:.2f} req/s, p50 {row['p50_s']:.2f} s, "
                f"p95 {row['p95_s']:.2f} s (load {load:.2f}->{row['load_after']:.2f})")
            rows.append(row)
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = script_parser("serve", __doc__)
    parser.add_argument("--threads", type=POSITIVE, default=2, help="each server's threads")
    parser.add_argument("--tasks", type=names(["summarize", "transcribe"]), default="summarize,transcribe",
                        help="comma-separated: summarize, transcribe")
    parser.add_argument("--compute-type", choices=["float32", "bfloat16", "int8"], default="float32",
                        help="the transcription servers' precision (summaries stay float32)")
    parser.add_argument("--beam-size", type=POSITIVE, default=1,
                        help="the transcription servers' beam size (1: greedy, as OpenAI's API; "
                             "5: faster-whisper's default)")
    parser.add_argument("--max-running-requests", type=positive_int_or_auto, default="auto",
                        help="encdec serve's --max-running-requests (auto: as encdec serve)")
    parser.add_argument("--requests", type=nonempty_list(number(int, 2), "comma-separated integers >= 2"),
                        default="6,24,64", help=f"requests sent at {', '.join(map(str, CLIENTS))} clients "
                                                "(fewer: a shorter, noisier run)")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench" / "serve",
                        help="where the checkpoint is made once and the clips each run")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve.json", help="results")
    parser.add_argument("--serve-baseline", choices=["hf", "fw"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline, args.model, args.port, args.threads, args.compute_type,
                       args.beam_size)
        return
    if len(args.requests) != len(CLIENTS):
        parser.error(f"argument --requests: expected {len(CLIENTS)} comma-separated integers >= 2, "
                     f"got {','.join(map(str, args.requests))!r}")
    # a SystemExit, as Ctrl-C's KeyboardInterrupt, stops the servers started on its way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    tasks, work = args.tasks, args.work_dir
    me = [sys.executable, "-m", "benchmarks.bench_serve", "--threads", str(args.threads),
          "--compute-type", args.compute_type, "--beam-size", str(args.beam_size)]
    precision = {"float32": [], "bfloat16": ["--dtype", "bfloat16"],
                 "int8": ["--quantization", "int8"]}[args.compute_type]
    setups = {  # task -> (inputs, model, baseline, its name, encdec's options), made when run
        "summarize": lambda: (make_articles(16), str(make_checkpoint(work / "bart")), "hf", "hf-pipeline", []),
        "transcribe": lambda: (make_clips(work / "clips", 12), "tiny.en", "fw", "faster-whisper", precision)}
    fields = {  # task -> the request fields besides the model and the input
        "summarize": {"max_tokens": SUMMARY_TOKENS, "min_tokens": SUMMARY_TOKENS, "num_beams": 1,
                      "temperature": 0.0},
        "transcribe": {"beam_size": args.beam_size}}
    rows = []
    for task in [t for t in setups if t in tasks]:
        items, model, baseline, name, options = setups[task]()
        body = {"model": model, **fields[task]}
        compute = args.compute_type if task == "transcribe" else "float32"
        port = free_port()
        rows += measure("encdec", compute, [sys.executable, "-m", "encdec", "serve", "--model", model,
                                            *options, "--max-running-requests",
                                            str(args.max_running_requests), "--port", str(port),
                                            "--log-level", "warning"],
                        port, task, items, body, args.threads, args.requests, print)
        port = free_port()
        baseline_model = model if baseline == "hf" else tiny_en_dir()
        baseline_compute = faster_whisper_compute_type(compute) if baseline == "fw" else compute
        rows += measure(name, baseline_compute, [*me, "--serve-baseline", baseline, "--model",
                                                 baseline_model, "--port", str(port)],
                        port, task, items, body, args.threads, args.requests, print)
    encdec_rows = {(r["task"], r["clients"]): r for r in rows if r["system"] == "encdec"}
    for r in rows:
        if r["system"] != "encdec":
            r["vs_encdec"] = agreement(r["task"], encdec_rows[r["task"], r["clients"]]["outputs"], r["outputs"])
    table = markdown_table(
        ["task", "system", "compute", "clients", "requests", "req/s", "p50 s", "p95 s", "load", "answers vs encdec"],
        [[r["task"], r["system"], r["compute_type"], r["clients"], r["requests"], r["req_per_s"], r["p50_s"], r["p95_s"],
          f"{r['load_before']:.1f}-{r['load_after']:.1f}", agreement_cell(r.get("vs_encdec"))] for r in rows])
    print(table)
    for r in rows:
        match = r.get("vs_encdec", {})
        if r["task"] == "summarize" and match and match["identical"] < 1:
            print(f"WARNING: at {r['clients']} clients {r['system']}'s summaries differ from encdec's for "
                  f"{round((1 - match['identical']) * match['compared'])} of {match['compared']} articles "
                  f"({match['words_before_divergence']:.1%} of its words before the first divergence); "
                  f"greedy decoding of one checkpoint should give the same text")
    at32 = {(r["task"], r["system"]): r for r in rows if r["clients"] == 32}
    for task, baseline in (("summarize", "hf-pipeline"), ("transcribe", "faster-whisper")):
        if task not in tasks:
            continue
        ours, theirs = at32[(task, "encdec")], at32[(task, baseline)]
        print(f"{task} at 32 clients: encdec ({ours['compute_type']}) "
              f"{ours['req_per_s'] / theirs['req_per_s']:.2f}x the requests/s of {baseline} "
              f"({theirs['compute_type']}), p95 {ours['p95_s']:.2f} s vs {theirs['p95_s']:.2f} s")
    write_json(args.out, {"machine": machine(), "args": vars(args) | {"out": str(args.out), "work_dir": str(work)},
                          "rows": rows})


if __name__ == "__main__":
    main()
