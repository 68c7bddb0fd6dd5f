"""64 concurrent clients on loopback, twice: summaries (plain, streamed, and streamed ones that
disconnect midway) and transcriptions. Every completed request is correct, none is lost, all
blocks are free after each round, and the server's memory, once its engines have been idle for
IDLE_TRIM_SECONDS, does not grow between rounds."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from encdec import LLM, SamplingParams
from encdec.engine.async_engine import IDLE_TRIM_SECONDS
from tests.bart_checkpoints import CORPUS, summary_prompts
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import RemoteServer

CLIENTS = 64
SUMMARIES = 56
ROUND_TIMEOUT = 180  # seconds
SUMMARY = {"max_tokens": 16, "temperature": 0.0}
LEAVING = {"max_tokens": 150, "min_tokens": 150, "temperature": 0.0}  # still decoding when its client leaves


@pytest.fixture(scope="module")
def server(tiny_bart_dir):
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--model", "tiny.en", "--served-model-name", "tiny.en",
                           "--num-gpu-blocks", "2200", "--swap-space", "0.05",
                           "--log-level", "warning"])  # the address (--port 0's) is still told
    yield remote
    remote.stop()


async def summarize(http: httpx.AsyncClient, article: str, mode: str) -> str | None:
    body = {"model": "bart", "input": article, **(LEAVING if mode == "disconnect" else SUMMARY)}
    if mode == "plain":
        response = await http.post("/v1/summarize", json=body)
        assert response.status_code == 200, response.text
        return response.json()["summaries"][0]["text"]
    text = ""
    async with http.stream("POST", "/v1/summarize", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if mode == "disconnect":
                return None  # leave after the first event
            if line.startswith("data: {"):
                text += "".join(s["text"] for s in json.loads(line[6:])["summaries"])
    return text


async def transcribe(http: httpx.AsyncClient, path, stream: bool) -> str:
    data = {"model": "tiny.en", "stream": "true" if stream else "false"}
    response = await http.post("/v1/audio/transcriptions", data=data,
                               files={"file": (path.name, path.read_bytes(), "audio/wav")})
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()["text"]
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return events[-1]["text"]


def workload(audio_paths) -> list[tuple]:
    """(kind, input, mode) for each client: 56 summaries (11 leave midway), 8 transcriptions."""
    jobs = []
    for i in range(SUMMARIES):
        mode = "disconnect" if i % 5 == 4 else ("stream" if i % 2 else "plain")
        jobs.append(("summary", CORPUS[i % len(CORPUS)], mode))
    for i in range(CLIENTS - SUMMARIES):
        jobs.append(("transcription", audio_paths[i % len(audio_paths)], i % 3 == 0))
    return jobs


async def one_round(server: RemoteServer, jobs: list[tuple]) -> list:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=server.url, timeout=ROUND_TIMEOUT, limits=limits) as http:
        calls = [summarize(http, item, mode) if kind == "summary" else transcribe(http, item, mode)
                 for kind, item, mode in jobs]
        return await asyncio.wait_for(asyncio.gather(*calls), ROUND_TIMEOUT)


def test_64_clients_twice(server, tiny_bart_dir, speech_clips):
    audio_paths = [SAMPLE, *speech_clips]
    bart = LLM(str(tiny_bart_dir), num_gpu_blocks=512)
    summaries = {a: out.outputs[0].text for a, out in zip(CORPUS, bart.generate(
        summary_prompts(bart, CORPUS), SamplingParams(**SUMMARY, config_per_field=True), use_tqdm=False))}
    tiny_en = LLM("tiny.en", num_gpu_blocks=2200, swap_space=0.05)
    transcripts = {p: t.text for p, t in zip(audio_paths, tiny_en.transcribe([str(p) for p in audio_paths]))}
    jobs = workload(audio_paths)

    rss = []
    for _ in range(2):
        results = asyncio.run(one_round(server, jobs))
        for (kind, item, mode), result in zip(jobs, results):
            if mode == "disconnect":
                continue
            assert result == (summaries[item] if kind == "summary" else transcripts[item]), (kind, mode)
        server.wait_all_blocks_free()
        time.sleep(IDLE_TRIM_SECONDS + 1)  # the idle engines give their steps' pages back
        rss.append(server.rss_mb())
    assert abs(rss[1] - rss[0]) <= 0.05 * rss[0], rss
    # none lost: each request answered (200), or its client gone midway (499) and its work aborted
    done = server.metrics()
    statuses = {}
    for (name, labels), value in done.items():
        endpoint, status = dict(labels).get("endpoint"), dict(labels).get("status")
        if name == "encdec_http_requests_total" and value and endpoint.startswith("/v1/"):
            statuses[endpoint, status] = value
    left = sum(mode == "disconnect" for _, _, mode in jobs)
    assert statuses == {("/v1/summarize", "200"): 2 * (SUMMARIES - left), ("/v1/summarize", "499"): 2 * left,
                        ("/v1/audio/transcriptions", "200"): 2 * (CLIENTS - SUMMARIES)}
    assert done[("encdec_num_aborted_requests_total", (("model", "bart"),))] == 2 * left
