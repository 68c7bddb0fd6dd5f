"""A transcription job that keeps every request it hands out, for tests to read."""
from __future__ import annotations

from encdec.whisper.pipeline import TranscriptionJob, WindowRequest


class RecordingJob(TranscriptionJob):
    """`TranscriptionJob` whose `requests_made` lists the requests of `start`, `finish` and
    `align` in the order they were made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests_made: list[WindowRequest] = []

    def _record(self, requests: list[WindowRequest]) -> list[WindowRequest]:
        self.requests_made.extend(requests)
        return requests

    def start(self):
        return self._record(super().start())

    def finish(self, *args):
        return self._record(super().finish(*args))

    def align(self, *args):
        return self._record(super().align(*args))
