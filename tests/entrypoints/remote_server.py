"""`encdec serve` in a subprocess on a free 127.0.0.1 port, for the server tests.

`RemoteServer` starts it with `--port 0`, reads the port it bound from its log, waits for
`/health` (failing fast, with the server's log, if the process exits), hands out `openai`
clients with `max_retries=0`, reads `/metrics`, and stops the process. `HeldUpload` keeps a
transcription in flight for as long as a test needs. Nothing but loopback is used.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Union

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    """`{(sample name, sorted labels): value}` of a /metrics text."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class RemoteServer:
    def __init__(self, args: list[str], api_key: Optional[str] = None, startup_timeout: float = 180,
                 verify: Union[bool, str] = True, env: Optional[dict[str, str]] = None):
        """`verify`: for a server on HTTPS, the CA file its certificate is checked with; `env`:
        more environment variables for the server."""
        self.api_key, self.verify = api_key, verify
        self.log = tempfile.NamedTemporaryFile("w+", prefix="encdec-serve-", suffix=".log", delete=False)
        env = {**os.environ, **(env or {}), "ENCDEC_API_KEY": api_key or ""}
        if not api_key:
            env.pop("ENCDEC_API_KEY")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "encdec", "serve", *args, "--port", "0"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[2])
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        """Wait for the log's `serving ... on http(s)://127.0.0.1:PORT`, then for /health."""
        deadline, self.url = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"encdec serve exited with {self.proc.returncode}:\n{self.output()}")
            if self.url is None and (found := re.search(r" on (https?://127\.0\.0\.1:(\d+))\b", self.output())):
                self.url, self.port = found[1], int(found[2])
            try:
                if self.url and httpx.get(f"{self.url}/health", timeout=2, verify=self.verify).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"encdec serve was not healthy within {timeout} s:\n{self.output()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **options) -> openai.OpenAI:
        options = {"api_key": self.api_key or "none", "max_retries": 0, "timeout": 120, **options}
        if self.verify is not True and "http_client" not in options:
            options["http_client"] = httpx.Client(verify=self.verify)
        return openai.OpenAI(base_url=f"{self.url}/v1", **options)

    def http(self, **options) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=120, verify=self.verify, **options)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """`{(sample name, sorted labels): value}` of /metrics."""
        return metric_samples(httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10,
                                        verify=self.verify).text)

    def requests_in_flight(self) -> float:
        """HTTP requests being answered (every replica's, behind Ray Serve)."""
        return sum(v for (name, _), v in self.metrics().items() if name == "encdec_http_requests_in_flight")

    def wait_requests_in_flight(self, count: int, timeout: float = 60) -> None:
        """Until `count` requests are in flight (0: once the last one is counted off, just after
        its response's last byte)."""
        deadline = time.monotonic() + timeout
        while (now := self.requests_in_flight()) != count:
            assert time.monotonic() < deadline, f"{now} requests in flight after {timeout} s, not {count}"
            time.sleep(0.05)

    def engine_load(self) -> dict[tuple[str, tuple], float]:
        """The non-zero gauges of requests in the engines and of KV blocks in use."""
        names = ("encdec_kv_blocks_in_use", "encdec_kv_swap_blocks_in_use", "encdec_num_requests_running",
                 "encdec_num_requests_waiting", "encdec_num_requests_swapped")
        return {key: value for key, value in self.metrics().items() if key[0] in names and value}

    def wait_all_blocks_free(self, timeout: float = 15) -> None:
        """Every engine idle and every KV block free (aborts land between engine steps), read
        from gauges every served model shows (so that none free by being missing)."""
        deadline = time.monotonic() + timeout
        while (busy := self.engine_load()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not busy, f"engines still hold requests or blocks: {busy}"
        metrics = self.metrics()
        models = {dict(labels)["model"] for (name, labels), value in metrics.items()
                  if name == "encdec_kv_blocks_capacity" and value > 0}
        shown = {tuple(sorted(dict(labels).items())) for name, labels in metrics if name == "encdec_kv_blocks_in_use"}
        assert models and shown == {(("attention", kind), ("model", model))
                                    for model in models for kind in ("cross", "self")}, shown

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_output(self, logged: Callable[[str], bool], start: int = 0, timeout: float = 5) -> str:
        """The output past `start` once `logged` holds for it, or when `timeout` seconds are over
        (the server writes its log lines after it answers)."""
        deadline = time.monotonic() + timeout
        while not logged(output := self.output()[start:]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return output

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


class HeldUpload:
    """A transcription whose multipart upload stops short of its closing boundary until
    `finish()`: the server has the request in flight, and nothing for its engine yet."""

    BOUNDARY = "encdec-test-boundary"

    def __init__(self, url: str, model: str, audio: Path):
        self.url, self.model, self.audio = url, model, audio
        self.release, self.response = threading.Event(), None
        self.thread = threading.Thread(target=self._post, daemon=True)
        self.thread.start()

    def _body(self):
        yield (f'--{self.BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{self.model}\r\n'
               f'--{self.BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{self.audio.name}"\r\n'
               f'Content-Type: audio/wav\r\n\r\n').encode() + self.audio.read_bytes()
        self.release.wait(timeout=120)
        yield f"\r\n--{self.BOUNDARY}--\r\n".encode()

    def _post(self) -> None:
        try:
            self.response = httpx.post(f"{self.url}/v1/audio/transcriptions", content=self._body(), timeout=120,
                                       headers={"Content-Type": f"multipart/form-data; boundary={self.BOUNDARY}"})
        except httpx.HTTPError:  # the server went away first: no response
            pass

    def finish(self, timeout: float = 120) -> Optional[httpx.Response]:
        """Send the rest of the upload; the response (None if none came within `timeout`, or
        the server closed the connection first)."""
        self.release.set()
        self.thread.join(timeout)
        return self.response
