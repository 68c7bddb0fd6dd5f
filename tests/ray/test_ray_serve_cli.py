"""`encdec serve --ray` as a user runs it, in a subprocess: `--port 0` logs the port Serve's
proxy took, and on SIGTERM a transcription in flight finishes (its upload still arriving when the
signal comes) while new requests get 503 in OpenAI's error shape; replicas that cannot fit the
local instance are refused instead of waited for, and replicas that cannot load their model stop
the server with the reason on one line, as Ray that does not start stops it (and a batch job)."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from encdec import LLM
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import HeldUpload, RemoteServer

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


@pytest.mark.extended
def test_sigterm_drains_the_request_in_flight_and_refuses_new_ones():
    expected = LLM("tiny.en", num_gpu_blocks=600, swap_space=0.01).transcribe(str(SAMPLE))[0].text
    remote = RemoteServer(["--ray", "--replicas", "1", "--cpus-per-replica", "0.5", "--model", "tiny.en",
                           "--num-gpu-blocks", "600", "--swap-space", "0.01"], startup_timeout=300)
    held = None
    try:
        assert remote.port != 0 and f"serving on {remote.url} with 1 replicas" in remote.output()
        held = HeldUpload(remote.url, "tiny.en", SAMPLE)
        remote.wait_requests_in_flight(1)  # the replica holds the request, its upload unfinished
        remote.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10  # the replica hears of the drain within 2 s
        while (health := httpx.get(f"{remote.url}/health", timeout=5)).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert health.status_code == 503 and health.json()["error"]["code"] == "shutting_down"
        refused = httpx.get(f"{remote.url}/v1/models", timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
        response = held.finish()
        assert response.status_code == 200 and response.json()["text"] == expected
        assert remote.proc.wait(timeout=120) == 0
    finally:
        if held:
            held.release.set()
        remote.stop()


@pytest.mark.extended
def test_a_full_queue_gets_429_and_a_second_signal_stops_at_once(tiny_bart_dir):
    """Behind Serve as without it: past --max-waiting-requests a request is refused (429), not
    held back in Serve's queue; while the drain waits for a request in flight, a second SIGTERM
    ends the server at once."""
    remote = RemoteServer(["--ray", "--replicas", "1", "--cpus-per-replica", "0.5", "--model", "tiny.en",
                           "--model", str(tiny_bart_dir), "--served-model-name", "tiny.en", "--served-model-name",
                           "bart", "--max-num-seqs", "1", "--max-waiting-requests", "1", "--num-gpu-blocks", "600",
                           "--swap-space", "0.01"], startup_timeout=300)
    held = None
    try:
        body = {"model": "bart", "prompt": "The rain in spain.", "min_tokens": 250, "max_tokens": 250,
                "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: httpx.post(f"{remote.url}/v1/completions", json=body, timeout=120),
                                    range(6)))
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses[0] == 200 and statuses[-1] == 429, statuses  # one runs, one waits, the rest refused
        refused = next(answer for answer in answers if answer.status_code == 429)
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["code"] == "engine_overloaded"

        held = HeldUpload(remote.url, "tiny.en", SAMPLE)
        remote.wait_requests_in_flight(1)
        remote.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10  # the replica hears of the drain within 2 s
        while httpx.get(f"{remote.url}/health", timeout=5).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        remote.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert remote.proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert time.monotonic() - start < 30  # not the drain's 30 s and Serve's as many again
        assert "a second signal: stopping at once" in remote.output()
    finally:
        if held:
            held.release.set()
        remote.stop()


def test_replicas_that_cannot_fit_the_local_instance_are_refused():
    cpus = os.cpu_count()
    done = subprocess.run([sys.executable, "-m", "encdec", "serve", "--ray", "--replicas", str(cpus + 1),
                           "--model", "tiny.en", "--port", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert (f"encdec: error: --replicas {cpus + 1} x --cpus-per-replica 1 need {cpus + 1} CPUs; the Ray "
            f"cluster has {cpus} (the server could never start)") in done.stderr


@pytest.mark.extended
def test_replicas_that_cannot_load_the_model_stop_the_server(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory, of no model
    done = subprocess.run([sys.executable, "-m", "encdec", "serve", "--ray", "--model", str(tmp_path),
                           "--cpus-per-replica", "0.5", "--port", "0"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("encdec: error:")]
    assert len(errors) == 1, done.stderr[-4000:]
    assert errors[0].startswith(f"encdec: error: the replicas could not start: ModelLoadError: cannot load "
                           f"model '{tmp_path}': ValueError: Unrecognized model in {tmp_path}.")
    assert not [line for line in done.stderr.splitlines() if line.startswith("Traceback")]


@pytest.mark.parametrize("command", [["serve", "--ray", "--model", "tiny.en", "--port", "0"],
                                     ["batch", "transcribe", str(SAMPLE)]])
def test_ray_that_does_not_start_is_one_error_line(monkeypatch, tmp_path, capsys, command):
    """A raylet that misses Ray's start-up deadline (seen on a loaded machine) ends the command
    with Ray's reason, not a traceback."""
    import ray

    def init(**_):
        raise RuntimeError("Failed to start the raylet within 30 seconds.\n(details)")
    monkeypatch.setattr(ray, "init", init)
    from encdec.entrypoints.cli import main

    output = ["--output", str(tmp_path / "out")] if command[0] == "batch" else []
    assert main(command + output) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "encdec: error: Ray did not start on this machine: RuntimeError: Failed to start the raylet "
        "within 30 seconds.")
