"""An upload's length: read from the header where the container states it exactly, else counted
while decoding; a header's estimate never refuses audio within the limit. The audio in flight:
counted while held, refused past its limit."""
from __future__ import annotations

import asyncio
import io
import threading

import numpy as np
import pytest
import soundfile
from starlette.datastructures import UploadFile

from encdec.entrypoints.openai.errors import OpenAIError
from encdec.entrypoints.openai.serving_engine import off_loop
from encdec.entrypoints.openai.uploads import AudioInFlight, declared_length, decode_upload, stated_samples

RATE = 16000


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def upload(data: bytes, name: str) -> UploadFile:
    return UploadFile(io.BytesIO(data), size=len(data), filename=name)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG"])
def test_a_stated_length_is_read_from_the_header(tmp_path, fmt):
    path = tmp_path / f"a.{fmt.lower()}"
    soundfile.write(path, tone(2.5), RATE, format=fmt)
    with path.open("rb") as file:
        assert declared_length(file) == (2.5, 2.5 * RATE)
    assert stated_samples(upload(path.read_bytes(), path.name), max_seconds=3.0) == 2.5 * RATE
    with pytest.raises(OpenAIError, match=r"2\.50 s long, more than the server's limit of 2 s") as refused:
        stated_samples(upload(path.read_bytes(), path.name), max_seconds=2.0)
    assert refused.value.status == 400 and refused.value.param == "file"


def test_a_header_that_states_no_length_counts_nothing_before_decoding(tmp_path):
    soundfile.write(tmp_path / "a.mp3", tone(2.5), RATE, format="MP3")
    assert stated_samples(upload((tmp_path / "a.mp3").read_bytes(), "a.mp3"), max_seconds=3.0) == 0
    with pytest.raises(OpenAIError, match="empty.wav: the file is empty") as refused:
        stated_samples(upload(b"", "empty.wav"), max_seconds=3.0)
    assert refused.value.status == 400 and refused.value.param == "file"


def test_an_mp3_cut_short_is_measured_by_what_it_holds(tmp_path, capfd):
    """A cut MP3's header still counts the whole file: it is no reason to refuse it, and it is
    not read (libmpg123 prints warnings on the server's stderr when it reads odd ones)."""
    whole = tmp_path / "whole.mp3"
    soundfile.write(whole, tone(6.0), RATE, format="MP3")
    cut = whole.read_bytes()[:whole.stat().st_size // 3]
    (tmp_path / "cut.mp3").write_bytes(cut)
    assert soundfile.info(tmp_path / "cut.mp3").duration > 5.9  # what the header says
    capfd.readouterr()
    with (tmp_path / "cut.mp3").open("rb") as file:
        assert declared_length(file) == (0.0, 0)
    audio = decode_upload(upload(cut, "cut.mp3"), max_seconds=4.0)
    assert 1.0 < len(audio) / RATE < 3.0
    assert capfd.readouterr().err == ""
    with pytest.raises(OpenAIError, match="more than the server's limit of 4 s"):
        decode_upload(upload(whole.read_bytes(), "whole.mp3"), max_seconds=4.0)


@pytest.mark.parametrize("name", ["a.w\x00av", "a.\ud800", "a./", "a.wav\n", "x" * 300 + ".wav"])
def test_any_file_name_decodes(tmp_path, name):
    """The client's file name is only a hint: a NUL, a lone surrogate or a newline in it is no
    fault of the server's."""
    soundfile.write(tmp_path / "a.wav", tone(0.5), RATE)
    audio = decode_upload(upload((tmp_path / "a.wav").read_bytes(), name), max_seconds=2.0)
    assert len(audio) == RATE // 2


def test_audio_in_flight_is_counted_while_held_and_refused_past_the_limit():
    """An upload over the limit alone is taken; beside it another is refused with a 429, also one
    whose length is not known yet; the count goes back to nothing when a hold ends, also by an
    error."""
    in_flight = AudioInFlight(max_seconds=8)
    with in_flight.hold("long.wav", 10 * RATE):
        assert in_flight.samples == 10 * RATE
        with pytest.raises(OpenAIError) as refused:
            with in_flight.hold("short.wav", RATE // 10):
                pass
        with pytest.raises(OpenAIError) as unknown:
            with in_flight.hold("a.mp3", 0):
                pass
    assert (refused.value.status, refused.value.param, refused.value.code) == (429, "file", "audio_in_flight")
    assert refused.value.headers == {"Retry-After": "5"}
    assert refused.value.message == (
        "short.wav: the server is transcribing 10.0 s of audio already, and 0.1 s more would pass its "
        "limit of 8 s in flight (--max-audio-seconds-in-flight); try again later")
    assert unknown.value.status == 429 and unknown.value.message.startswith(
        "a.mp3: the server is transcribing 10.0 s of audio already, and more would pass its limit")
    with pytest.raises(RuntimeError):
        with in_flight.hold("a.wav", 5 * RATE):
            raise RuntimeError("the transcription failed")
    with in_flight.hold("a.wav", 5 * RATE), in_flight.hold("b.wav", 3 * RATE), in_flight.hold("c.mp3", 0):
        assert in_flight.samples == 8 * RATE  # at the limit, not past it
    assert in_flight.samples == 0


def test_work_off_the_loop_cancelled_ends_once_its_thread_ends():
    """A client that leaves while its upload decodes cancels the wait, not the decoding: the
    upload stays counted in flight until the thread is done with it."""
    started, release = threading.Event(), threading.Event()

    def decode() -> str:
        started.set()
        release.wait(10)
        return "decoded"

    async def main():
        waiting = asyncio.ensure_future(off_loop(decode))
        await asyncio.to_thread(started.wait, 10)
        waiting.cancel()
        await asyncio.sleep(0.1)
        waiting.cancel()  # a second cancellation does not end the wait either
        await asyncio.sleep(0.1)
        still_waiting = not waiting.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return still_waiting

    assert asyncio.run(main())
    assert asyncio.run(off_loop(sum, [1, 2])) == 3


def test_an_upload_is_counted_at_its_stated_length_then_at_its_own_without_a_gap():
    """Held at the header's length while it decodes, an upload is recounted at its decoded
    length: a shorter one always fits, a longer one is refused beside others (and stays counted
    as it was until released)."""
    in_flight = AudioInFlight(max_seconds=8)
    with in_flight.hold("a.flac", 4 * RATE) as first:
        first.recount(3 * RATE)  # shorter than its header said
        assert in_flight.samples == 3 * RATE
        second = in_flight.hold("b.mp3", 0)  # no stated length: nothing counted while it decodes
        with pytest.raises(OpenAIError, match="b.mp3: the server is transcribing 3.0 s of audio already, "
                                              "and 6.0 s more would pass its limit of 8 s") as refused:
            second.recount(6 * RATE)
        assert refused.value.status == 429 and in_flight.samples == 3 * RATE
        second.recount(5 * RATE)  # 8 s: at the limit
        assert in_flight.samples == 8 * RATE
        second.release()
        second.release()
        assert in_flight.samples == 3 * RATE
    assert in_flight.samples == 0
    with in_flight.hold("alone.mp3", 0) as alone:
        alone.recount(20 * RATE)  # alone, past the limit: taken
        assert in_flight.samples == 20 * RATE
    assert in_flight.samples == 0
