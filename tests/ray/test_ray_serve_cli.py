"""`encdec serve --ray` as a user runs it, in a subprocess: `--port 0` logs the port Serve's
proxy took, and SIGTERM lets a transcription in flight finish before the process ends."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import soundfile

from encdec import LLM
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import RemoteServer

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


def test_sigterm_lets_the_request_in_flight_finish(tmp_path):
    audio, rate = soundfile.read(SAMPLE)
    long_audio = tmp_path / "long.wav"
    soundfile.write(long_audio, np.tile(audio, 10), rate)
    expected = LLM("tiny.en", num_gpu_blocks=600, swap_space=0.01).transcribe(str(long_audio))[0].text
    remote = RemoteServer(["--ray", "--replicas", "1", "--cpus-per-replica", "0.5", "--model", "tiny.en",
                           "--num-gpu-blocks", "600", "--swap-space", "0.01"], startup_timeout=300)
    answer: dict = {}

    def transcribe() -> None:
        with open(long_audio, "rb") as file:
            answer["text"] = remote.client().audio.transcriptions.create(model="tiny.en", file=file).text

    try:
        assert remote.port != 0 and f"serving on {remote.url} with 1 replicas" in remote.output()
        request = threading.Thread(target=transcribe)
        request.start()
        time.sleep(2)  # uploaded, decoding
        remote.proc.send_signal(signal.SIGTERM)
        request.join(timeout=120)
        assert answer.get("text") == expected
        assert remote.proc.wait(timeout=120) == 0
    finally:
        remote.stop()
