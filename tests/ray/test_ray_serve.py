"""`encdec serve --ray --replicas 2` on a local Ray instance, answered through the official
`openai` client on 127.0.0.1: the offline `LLM`'s results; a request in flight on a replica that
is killed gets a 5xx, and the next requests succeed (Serve replaces the replica). `--autoscale`
gives Serve a replica range."""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
import soundfile
from prometheus_client.parser import text_string_to_metric_families

from encdec import LLM, SamplingParams
from encdec.entrypoints.cli import build_parser
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import free_port
from tests.ray.conftest import init_ray

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
from encdec.entrypoints.ray.replica_board import PUBLISH_SECONDS  # noqa: E402  (imports Ray)
pytestmark = pytest.mark.ray

ARTICLES = ["The rain in spain falls mainly on the plain.",
            "Continuous batching lets new requests join while others are still being decoded."]


@pytest.fixture(scope="module")
def served(tiny_bart_dir):
    """The parsed `encdec serve --ray` arguments, deployed; the client's base URL."""
    from encdec.entrypoints.ray.serve import deploy

    init_ray(num_cpus=2)
    args = build_parser().parse_args(
        ["serve", "--ray", "--replicas", "2", "--cpus-per-replica", "0.5", "--port", str(free_port()),
         "--model", str(tiny_bart_dir), "--served-model-name", "bart",
         "--model", "tiny.en", "--served-model-name", "tiny.en",
         "--num-gpu-blocks", "600", "--swap-space", "0.01"])
    board = deploy(args)  # noqa: F841  (held while serving)
    yield f"http://127.0.0.1:{args.port}/v1"
    serve.shutdown()
    ray.shutdown()


def client(url: str):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def replica_names() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")]


def replica_ids() -> list[str]:
    return [name.rpartition("#")[2] for name in replica_names()]


def completions(url: str, bart_expected: list[str]) -> None:
    result = client(url).completions.create(model="bart", prompt=ARTICLES, max_tokens=12, temperature=0.0)
    assert [c.text for c in result.choices] == bart_expected


@pytest.fixture(scope="module")
def bart_expected(tiny_bart_dir) -> list[str]:
    llm = LLM(str(tiny_bart_dir), num_gpu_blocks=600, swap_space=0.01)
    outputs = llm.generate(ARTICLES, SamplingParams(temperature=0.0, max_tokens=12, config_per_field=True),
                           use_tqdm=False)
    return [out.outputs[0].text for out in outputs]


def test_openai_client_gets_offline_results(served, bart_expected):
    assert len(replica_names()) == 2
    assert [m.id for m in client(served).models.list().data] == ["bart", "tiny.en"]
    completions(served, bart_expected)
    streamed = client(served).completions.create(model="bart", prompt=ARTICLES[0], max_tokens=12,
                                                 temperature=0.0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == bart_expected[0]
    expected = LLM("tiny.en", num_gpu_blocks=600, swap_space=0.01).transcribe(str(SAMPLE))[0]
    with open(SAMPLE, "rb") as audio:
        assert client(served).audio.transcriptions.create(model="tiny.en", file=audio).text == expected.text


def test_one_request_id_goes_back(served):
    """Serve's proxy sends the request id back, the client's or its own: the app sends none of
    its own beside it."""
    base = served.removesuffix("/v1")
    given = httpx.get(f"{base}/v1/models", headers={"X-Request-Id": "client-7"}, timeout=30)
    assert given.headers.get_list("x-request-id") == ["client-7"]
    assert len(httpx.get(f"{base}/v1/models", timeout=30).headers.get_list("x-request-id")) == 1


def completions_by_replica(url: str) -> dict[str, float]:
    """`/metrics`: the completions each replica answered (200), by replica."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {s.labels["replica"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "encdec_http_requests_total" and s.labels["endpoint"] == "/v1/completions"
            and s.labels["status"] == "200"}


def test_metrics_count_every_replicas_requests(served, bart_expected):
    """Whichever replica answers a scrape, it shows both replicas' series, labelled (another
    replica's as of the answering one's last publish: two publishes after the requests)."""
    time.sleep(2 * PUBLISH_SECONDS + 1)
    before = sum(completions_by_replica(served).values())
    for _ in range(6):
        completions(served, bart_expected)
    time.sleep(2 * PUBLISH_SECONDS + 1)
    for _ in range(4):  # several scrapes: both replicas answer some
        counts = completions_by_replica(served)
        assert set(counts) == set(replica_ids()) and sum(counts.values()) == before + 6, counts


def busiest_replica(seconds: float = 1.0):
    """The process of the replica that used the most CPU over the next `seconds`."""
    import psutil

    replicas = [p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] and p.info["cmdline"][0].startswith("ray::ServeReplica")]
    before = {p.pid: sum(p.cpu_times()[:2]) for p in replicas}
    time.sleep(seconds)
    return max(replicas, key=lambda p: sum(p.cpu_times()[:2]) - before[p.pid])


def test_requests_succeed_after_a_replica_is_killed(served, bart_expected, tmp_path):
    audio, rate = soundfile.read(SAMPLE)
    long_audio = tmp_path / "long.wav"
    soundfile.write(long_audio, np.tile(audio, 30), rate)  # two minutes: seconds of work
    in_flight: dict = {}

    def transcribe_long() -> None:
        try:
            with open(long_audio, "rb") as file:
                in_flight["text"] = client(served).audio.transcriptions.create(model="tiny.en", file=file).text
        except openai.APIStatusError as err:
            in_flight["status"] = err.status_code

    before = set(replica_names())
    request = threading.Thread(target=transcribe_long)
    request.start()
    time.sleep(2)  # upload and decode
    busiest_replica().kill()
    request.join(timeout=120)
    assert not request.is_alive(), "the request on the killed replica hangs"
    assert in_flight.get("status", 0) >= 500, in_flight
    for _ in range(6):
        completions(served, bart_expected)
    deadline = time.monotonic() + 120
    while (set(replica_names()) >= before or len(replica_names()) < 2) and time.monotonic() < deadline:
        time.sleep(1)
    assert not set(replica_names()) >= before and len(replica_names()) == 2, "Serve did not replace the replica"
    completions(served, bart_expected)


def test_autoscale_gives_serve_a_replica_range():
    from encdec.entrypoints.ray.serve import application, replica_options

    args = build_parser().parse_args(["serve", "--ray", "--autoscale", "0,3", "--max-num-seqs", "8",
                                      "--model", "tiny.en"])
    assert replica_options(args) == {"num_replicas": "auto", "autoscaling_config": {
        "min_replicas": 0, "initial_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8}}
    application(args)  # Serve accepts the deployment's options
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--ray", "--autoscale", "2,1", "--model", "tiny.en"])
