"""Ray test fixtures: 20 espeak-ng clips, 50 documents, and what the offline `LLM` makes of
them (the reference every Ray job must reproduce)."""
from __future__ import annotations

import fcntl
import json
import shutil
import signal
from pathlib import Path

import pytest

from encdec import LLM, SamplingParams
from tests.bart_checkpoints import CORPUS as SENTENCES
from tests.bart_checkpoints import summary_prompts
from tests.speech_corpus import CORPUS, speak

SUMMARY_TOKENS = 16
TEST_SECONDS = 600  # each test's limit: a Ray job that waits for resources would wait forever
SMALL_CACHE = ["--num-gpu-blocks", "600", "--swap-space", "0.01"]  # per actor


def init_ray(**options) -> None:
    """`ray.init`, by default of a new local instance (not one a killed test left behind),
    tried three times: on a loaded machine the raylet can miss Ray's fixed 30 s start-up deadline."""
    import ray

    for attempt in range(3):
        try:
            ray.init(**{"address": "local", **options}, include_dashboard=False, log_to_driver=False)
            return
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise


@pytest.fixture(scope="module", autouse=True)
def one_ray_module_at_a_time(tmp_path_factory):
    """Modules run in two pytest-xdist workers: a Ray module waits for the other worker's to end
    (two local Ray instances on two cores starve each other)."""
    with open(tmp_path_factory.getbasetemp().parent / "ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def time_limit():
    def expire(*_):
        raise TimeoutError(f"the test ran over {TEST_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def read_results(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def clip_paths(tmp_path_factory) -> list[str]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("ray_clips")
    for i, (voice, speed, text) in enumerate(CORPUS):
        speak(folder, f"clip{i:02d}", voice, speed, text)
    return sorted(str(p) for p in folder.glob("*.wav"))


@pytest.fixture(scope="session")
def offline_transcripts(clip_paths) -> dict[str, str]:
    llm = LLM("tiny.en", num_gpu_blocks=600, swap_space=0.01)
    return {path: result.text for path, result in zip(clip_paths, llm.transcribe(clip_paths))}


@pytest.fixture(scope="session")
def documents() -> dict[str, str]:
    """50 documents of two to four sentences, as `{id: text}`."""
    n = len(SENTENCES)
    return {f"doc{i:02d}": " ".join(SENTENCES[(i + k * 3) % n] for k in range(2 + i % 3)) for i in range(50)}


@pytest.fixture(scope="session")
def documents_jsonl(documents, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray_docs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in documents.items()))
    return path


@pytest.fixture(scope="session")
def offline_summaries(tiny_bart_dir, documents) -> dict[str, str]:
    llm = LLM(str(tiny_bart_dir), num_gpu_blocks=600, swap_space=0.01)
    # as `encdec summarize` and the server decode: the config fills each unset field
    params = SamplingParams(temperature=0.0, max_tokens=SUMMARY_TOKENS, config_per_field=True)
    outputs = llm.generate(summary_prompts(llm, list(documents.values())), params, use_tqdm=False)
    summaries = dict(zip(documents, (out.outputs[0].text.strip() for out in outputs)))
    assert len(set(summaries.values())) > 10, "the random model should summarize documents differently"
    return summaries
