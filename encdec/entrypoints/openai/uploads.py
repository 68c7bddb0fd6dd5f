"""Audio uploads: the size limit checked while the body streams in, the stated length read and
the audio decoded (on threads, by the caller), the audio in flight bounded (an upload whose header
states its length counts from before it is decoded, with no gap until its transcription ends).

The declared Content-Length is checked first; then a counting reader stops the body as soon as
it passes the limit (with room for the form's other fields), so an upload is never read whole
before the check; then the file's own size. The rest of an
oversized body is read and dropped (up to the limit again) so that the client, still sending,
gets to read the 413 instead of a reset connection.
"""
from __future__ import annotations

import math
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np
import soundfile
from fastapi import Request
from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive

from encdec.audio import SAMPLE_RATE, TooManySamples, load_audio
from encdec.entrypoints.openai.errors import OpenAIError, bad_request

MAX_FORM_FIELDS = 32
FORM_FIELDS_BYTES = 1024 * 1024  # what a form may carry beside its file: framing, text fields (a prompt)
MAX_FIELD_BYTES = 1024 * 1024  # each of those fields (starlette's default)
# starlette's refusals of a form's other fields, by the start of their words, in the server's
# (starlette does not say which field)
FIELD_REFUSALS = {
    "Too many fields": f"the form has more than {MAX_FORM_FIELDS} fields",
    "Part exceeded maximum size": f"a form field is larger than {MAX_FIELD_BYTES // (1024 * 1024)} MiB, the "
                                  f"limit of each field other than the file"}
# the first bytes of the containers whose header states their length exactly (libsndfile reads it)
COUNTED_CONTAINERS = (b"RIFF", b"RF64", b"fLaC", b"OggS", b"FORM", b"caff")
MAX_UPLOAD_RATE = 48_000  # Hz: an upload of the longest audio taken has at most this many samples a second
AUDIO_RETRY_AFTER_SECONDS = 5  # Retry-After of an upload refused for the audio in flight


class UploadTooLarge(Exception):
    def __init__(self, last: Message):
        super().__init__()
        self.last = last  # the message that passed the limit


def too_large(max_bytes: int) -> OpenAIError:
    return OpenAIError(413, f"the file is larger than the server's limit of {max_bytes} bytes "
                            f"(--max-upload-mb)", "file", "upload_too_large")


async def discard_body(receive: Receive, max_bytes: int, last: Optional[Message] = None) -> None:
    """Read and drop what the client is still sending after `last` (None: nothing read yet), up
    to `max_bytes`, or until it stalls (the server's paced `receive` raises its 408, which must
    not replace the 413 decided already)."""
    dropped = 0
    while last is None or (last["type"] == "http.request" and last.get("more_body", False)):
        if dropped > max_bytes:
            return
        try:
            last = await receive()
        except OpenAIError:
            return
        dropped += len(last.get("body", b""))


async def read_form(request: Request, max_bytes: int) -> FormData:
    """The multipart form of `request`, refused with a 413 if its file is over `max_bytes` (as
    OpenAI limits the file, not the request): while it streams in, once the body passes
    `max_bytes` and FORM_FIELDS_BYTES more; then the file's exact size."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise bad_request(f"Content-Type must be multipart/form-data, got {content_type or 'none'!r}")
    max_body = max_bytes + FORM_FIELDS_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body:
        await discard_body(request.receive, max_body)
        raise too_large(max_bytes)
    received, closed, carried = 0, False, b""
    closing = b"--" + parse_options_header(content_type)[1].get(b"boundary", b"") + b"--"

    async def counting_receive():
        nonlocal received, closed, carried
        message = await request.receive()
        body = message.get("body", b"")
        received += len(body)
        if not closed:  # looked for across the body's pieces (the boundary never occurs in a part)
            closed = closing in carried + body
            carried = (carried + body)[-(len(closing) - 1):]
        if received > max_body:
            raise UploadTooLarge(message)
        return message

    try:
        form = await Request(request.scope, counting_receive).form(max_files=1, max_fields=MAX_FORM_FIELDS,
                                                                   max_part_size=MAX_FIELD_BYTES)
    except UploadTooLarge as err:
        await discard_body(request.receive, max_body, err.last)
        raise too_large(max_bytes) from None
    except HTTPException as err:  # starlette's 400 for a malformed form
        refusal = next((words for start, words in FIELD_REFUSALS.items() if err.detail.startswith(start)), None)
        if refusal is not None:
            raise bad_request(refusal) from None
        raise bad_request(f"the multipart form cannot be read: {err.detail}", "file") from None
    if not closed:  # the parser drops a last part left open
        await form.close()
        raise bad_request("the multipart form is cut short: it ends before its closing boundary", "file")
    upload = form.get("file")
    if isinstance(upload, UploadFile) and upload.size is not None and upload.size > max_bytes:
        await form.close()
        raise too_large(max_bytes)
    return form


def form_fields(form: FormData) -> tuple[UploadFile, dict]:
    """The uploaded `file`, and the other fields (lists for the bracketed `name[]` keys, a dict
    for the `name[key]` ones, as the official client sends a list and an object)."""
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("'file' is required: upload the audio as a file part", "file")
    fields: dict = {}
    for key in form.keys():
        values = form.getlist(key)
        if key == "file":
            continue
        if any(not isinstance(v, str) for v in values):
            raise bad_request(f"{key!r} must be a text field, not a file", key)
        if key.endswith("[]"):
            fields[key] = values
        elif len(values) > 1:
            raise bad_request(f"{key!r} is given {len(values)} times", key)
        elif (member := re.fullmatch(r"(\w+)\[(\w+)\]", key)) is not None:
            name, item = member.groups()
            parent = fields.setdefault(name, {})
            if not isinstance(parent, dict):
                raise bad_request(f"{name!r} is given both as a value and as an object", name)
            parent[item] = values[0]
        else:
            if isinstance(fields.get(key), dict):
                raise bad_request(f"{key!r} is given both as a value and as an object", key)
            fields[key] = values[0]
    return upload, fields


def upload_name(upload: UploadFile) -> str:
    """The upload's file name, for messages."""
    return upload.filename or "file"


def file_suffix(name: str) -> str:
    """The upload's extension for its temporary copy (a hint to FFmpeg's probe), of ASCII
    letters and digits only: the client's file name may hold anything."""
    extension = "".join(c for c in Path(name).suffix[1:16] if c.isascii() and c.isalnum())
    return "." + extension if extension else ""


def stated_samples(upload: UploadFile, max_seconds: float) -> int:
    """The 16 kHz samples of the audio the upload's header states, read without decoding (0
    where its format states none); a 400 (param `file`) if the upload is empty or its header
    states more than `max_seconds`, or more samples per channel than MAX_UPLOAD_RATE allows."""
    name = upload_name(upload)
    if upload.size == 0:
        raise bad_request(f"{name}: the file is empty", "file")
    seconds, frames = declared_length(upload.file)
    if seconds > max_seconds:
        raise too_long(name, seconds, max_seconds)
    if frames > int(max_seconds * MAX_UPLOAD_RATE):
        raise too_dense(name, int(max_seconds * MAX_UPLOAD_RATE), max_seconds)
    return round(seconds * SAMPLE_RATE)


def decode_upload(upload: UploadFile, max_seconds: float) -> np.ndarray:
    """The upload (`stated_samples` refused it if empty) as a 16 kHz waveform; a 400 (param
    `file`) if it is not audio or longer than `max_seconds`. Its samples per channel are bounded
    too, at `max_seconds` of MAX_UPLOAD_RATE audio, while it is decoded: a small file of a high
    sample rate or many channels must not take the memory."""
    name = upload_name(upload)
    max_samples = int(max_seconds * MAX_UPLOAD_RATE)
    with tempfile.NamedTemporaryFile(suffix=file_suffix(name)) as copy:
        upload.file.seek(0)
        shutil.copyfileobj(upload.file, copy)
        copy.flush()
        try:
            audio = load_audio(copy.name, max_samples=max_samples)
        except TooManySamples as err:
            if err.seconds > max_seconds:  # too long already, whatever its rate
                raise too_long(name, None, max_seconds) from None
            raise too_dense(name, max_samples, max_seconds) from None
        except ValueError as err:
            reason = str(err).replace(f"{copy.name}: ", "").replace(copy.name, name)
            raise bad_request(f"{name}: cannot decode the audio: {reason}", "file") from None
    if len(audio) / SAMPLE_RATE > max_seconds:
        raise too_long(name, len(audio) / SAMPLE_RATE, max_seconds)
    return audio


def declared_length(file: BinaryIO) -> tuple[float, int]:
    """The seconds and samples per channel a WAV, FLAC, OGG, AIFF or CAF header states, read
    without decoding; (0.0, 0) for other formats (an MP3's header holds an estimate at most)."""
    file.seek(0)
    if file.read(4) not in COUNTED_CONTAINERS:
        return 0.0, 0
    file.seek(0)
    try:
        info = soundfile.info(file)
    except Exception:  # a header soundfile does not read: decoding counts
        return 0.0, 0
    return info.duration, info.frames


def too_dense(name: str, max_samples: int, max_seconds: float) -> OpenAIError:
    return bad_request(f"{name}: the audio has more than {max_samples} samples per channel, the "
                       f"server's limit ({max_seconds:g} s at {MAX_UPLOAD_RATE} Hz: "
                       f"--max-audio-seconds); send it at a lower sample rate", "file")


def too_long(name: str, seconds: Optional[float], max_seconds: float) -> OpenAIError:
    """`seconds`: the audio's length, None where it was not read to its end."""
    # rounded up: never shown as the limit itself
    length = "longer" if seconds is None else f"{math.ceil(seconds * 100) / 100:.2f} s long, more"
    return bad_request(f"{name}: the audio is {length} than the server's limit of {max_seconds:g} s "
                       f"(--max-audio-seconds)", "file")


class AudioInFlight:
    """The audio held by the uploads being transcribed, at most `max_seconds` (a decoded hour
    and its log-mel take about 340 MB): an upload that would pass it while others are in flight
    is refused with a 429 (the client retries later); one alone is always taken."""

    def __init__(self, max_seconds: float):
        self.max_seconds = max_seconds
        self.samples = 0  # counted in samples, which add up exactly

    def hold(self, name: str, samples: int) -> HeldAudio:
        """Count `samples` (16 kHz samples of the upload `name`) until the hold is released (or
        its `with` block ends); a 429 if they would pass the limit beside others."""
        self.check(name, self.samples, samples)
        held = HeldAudio(self, name)
        held.recount(samples)
        return held

    def check(self, name: str, others: int, samples: int) -> None:
        """A 429 if `samples` beside `others` (the count of the other uploads) pass the limit."""
        if others and (others + samples) / SAMPLE_RATE > self.max_seconds:
            more = f"{samples / SAMPLE_RATE:.1f} s more" if samples else "more"
            raise OpenAIError(429, f"{name}: the server is transcribing {others / SAMPLE_RATE:.1f} s "
                                   f"of audio already, and {more} would pass its limit of "
                                   f"{self.max_seconds:g} s in flight (--max-audio-seconds-in-flight); "
                                   f"try again later", "file", "audio_in_flight",
                              headers={"Retry-After": str(AUDIO_RETRY_AFTER_SECONDS)})


class HeldAudio:
    """One upload's count in `AudioInFlight`: its header's stated length while it decodes, then
    its decoded length, without letting go in between."""

    def __init__(self, in_flight: AudioInFlight, name: str):
        self.in_flight, self.name, self.samples = in_flight, name, 0

    def recount(self, samples: int) -> None:
        """Count `samples` instead; a 429 (the count unchanged) if more would pass the limit."""
        if samples > self.samples:
            self.in_flight.check(self.name, self.in_flight.samples - self.samples, samples)
        self.in_flight.samples += samples - self.samples
        self.samples = samples

    def release(self) -> None:
        """Count nothing more (again: nothing happens)."""
        self.in_flight.samples -= self.samples
        self.samples = 0

    def __enter__(self) -> HeldAudio:
        return self

    def __exit__(self, *_: Any) -> None:
        self.release()
