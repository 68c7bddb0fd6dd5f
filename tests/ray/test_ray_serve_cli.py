"""`encdec serve --ray` as a user runs it, in a subprocess: `--port 0` logs the port Serve's
proxy took, and on SIGTERM a transcription in flight finishes (its upload still arriving when the
signal comes) while new requests get 503 in OpenAI's error shape."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from encdec import LLM
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import RemoteServer

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray
BOUNDARY = "encdec-test-boundary"


def test_sigterm_drains_the_request_in_flight_and_refuses_new_ones():
    expected = LLM("tiny.en", num_gpu_blocks=600, swap_space=0.01).transcribe(str(SAMPLE))[0].text
    remote = RemoteServer(["--ray", "--replicas", "1", "--cpus-per-replica", "0.5", "--model", "tiny.en",
                           "--num-gpu-blocks", "600", "--swap-space", "0.01"], startup_timeout=300)
    upload_rest, answer = threading.Event(), {}

    def body():
        yield (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny.en\r\n'
               f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="hello.wav"\r\n'
               f'Content-Type: audio/wav\r\n\r\n').encode() + SAMPLE.read_bytes()
        upload_rest.wait(timeout=60)
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    def transcribe() -> None:
        answer["response"] = httpx.post(
            f"{remote.url}/v1/audio/transcriptions", content=body(), timeout=120,
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})

    try:
        assert remote.port != 0 and f"serving on {remote.url} with 1 replicas" in remote.output()
        request = threading.Thread(target=transcribe)
        request.start()
        time.sleep(2)  # the replica holds the request, its upload unfinished
        remote.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10  # the replica hears of the drain within 2 s
        while (health := httpx.get(f"{remote.url}/health", timeout=5)).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert health.status_code == 503 and health.json()["error"]["code"] == "shutting_down"
        refused = httpx.get(f"{remote.url}/v1/models", timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable"
        upload_rest.set()
        request.join(timeout=120)
        assert answer["response"].status_code == 200 and answer["response"].json()["text"] == expected
        assert remote.proc.wait(timeout=120) == 0
    finally:
        upload_rest.set()
        remote.stop()
