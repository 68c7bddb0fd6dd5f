"""Ray scale-out on this machine: 1 and 2 actors (batch) and replicas (serve), Whisper tiny.en.

* batch: `transcribe_dataset` over espeak-ng clips (tests.speech_corpus), actors at 0.5 CPU,
  2 clips per call; clips/s over the job's wall time, actor start-up (model load) included.
* serve: `encdec serve --ray` (one CPU per replica) answering /v1/audio/transcriptions of
  samples/hello.wav from `--concurrency` clients; requests/s over all requests' wall time,
  measured after one warm-up request per replica.

One local Ray instance (`ray.init(num_cpus=2)`) for everything; the 1-minute load average is
reported with each row, since other processes share the cores.

    python -m benchmarks.bench_ray [--clips 20] [--requests 24] [--concurrency 4]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.common import POSITIVE, machine, markdown_table

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "hello.wav"
CACHE = dict(num_gpu_blocks=600, swap_space=0.01)


def make_clips(folder: Path, count: int) -> list[str]:
    from tests.speech_corpus import CORPUS, speak

    spoken = [CORPUS[i % len(CORPUS)] for i in range(count)]
    for i, (voice, speed, text) in enumerate(spoken):
        speak(folder, f"clip{i:03d}", voice, speed, text)
    return sorted(str(p) for p in folder.glob("clip*.wav"))


def batch_row(clips: list[str], replicas: int) -> list:
    from encdec.entrypoints.ray.batch import PoolOptions, audio_dataset, transcribe_dataset

    start = time.monotonic()
    rows = transcribe_dataset(audio_dataset(clips), "tiny.en",
                              PoolOptions(replicas=replicas, batch_size=2, llm_options=CACHE)).take_all()
    seconds = time.monotonic() - start
    assert len(rows) == len(clips) and not any(r["error"] for r in rows)
    return ["batch transcribe", replicas, len(clips), round(seconds, 1), round(len(clips) / seconds, 3),
            round(os.getloadavg()[0], 1)]


def serve_row(replicas: int, requests: int, concurrency: int) -> list:
    from ray import serve

    from tests.entrypoints.remote_server import free_port
    from encdec.entrypoints.cli import build_parser
    from encdec.entrypoints.ray.serve import deploy

    port = free_port()
    deploy(build_parser().parse_args(
        ["serve", "--ray", "--replicas", str(replicas), "--port", str(port), "--model", "tiny.en",
         "--num-gpu-blocks", str(CACHE["num_gpu_blocks"]), "--swap-space", str(CACHE["swap_space"])]))
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
    audio = SAMPLE.read_bytes()

    def transcribe(_) -> None:
        response = httpx.post(url, data={"model": "tiny.en"}, files={"file": ("hello.wav", audio)},
                              timeout=600)
        response.raise_for_status()

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(transcribe, range(replicas)))  # warm-up
        start = time.monotonic()
        list(pool.map(transcribe, range(requests)))
        seconds = time.monotonic() - start
    serve.shutdown()
    return [f"serve, {concurrency} clients", replicas, requests, round(seconds, 1),
            round(requests / seconds, 3), round(os.getloadavg()[0], 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=POSITIVE, default=20)
    parser.add_argument("--requests", type=POSITIVE, default=24)
    parser.add_argument("--concurrency", type=POSITIVE, default=4)
    args = parser.parse_args()
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        clips = make_clips(Path(folder), args.clips)
        for replicas in (1, 2):
            rows.append(batch_row(clips, replicas))
            print(rows[-1], flush=True)
    for replicas in (1, 2):
        rows.append(serve_row(replicas, args.requests, args.concurrency))
        print(rows[-1], flush=True)
    ray.shutdown()
    print(machine())
    print(markdown_table(["job", "actors / replicas", "inputs", "wall s", "inputs/s", "load (1 min)"], rows))


if __name__ == "__main__":
    main()
