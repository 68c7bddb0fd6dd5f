"""`POST /v1/audio/transcriptions` and `/v1/audio/translations` (OpenAI's multipart forms).

The upload is decoded off the event loop, then transcribed through the model's engine with
`AsyncLLMEngine.transcribe`: its windows share the engine's batch with every other upload in
flight. `temperature` t means openai-whisper's fallback from t up to 1.0 in steps of 0.2
(OpenAI: 0 "increases the temperature until certain thresholds are hit"); the extra fields
(`beam_size`, `temperature_increment_on_fallback`, ...) are openai-whisper's options, checked
before the audio is decoded. `timestamp_granularities[]=word` times every word and returns
them as verbose_json's top-level `words`. Streamed transcriptions send a
`transcript.text.delta` event as each stretch of segments is final, then one
`transcript.text.done` (with the usage, as json has it).
"""
from __future__ import annotations

import asyncio
import io
from typing import AsyncIterator, Optional, Union

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError

from encdec.audio import SAMPLE_RATE
from encdec.engine.async_engine import Admission
from encdec.entrypoints.openai.errors import OpenAIError, bad_request, validation_error, value_error
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.protocol import (ServerVad, TranscriptionDelta, TranscriptionDone,
                                                TranscriptionRequest, TranscriptionUsage,
                                                TranscriptionVerbose, TranslationRequest)
from encdec.entrypoints.openai.serving_engine import off_loop
from encdec.entrypoints.openai.serving_models import ServedModel, ServedModels
from encdec.entrypoints.openai.streaming import DONE, cancel_on_disconnect, event_stream, sse
from encdec.entrypoints.openai.uploads import (AudioInFlight, HeldAudio, decode_upload, form_fields, read_form,
                                               stated_samples, upload_name)
from encdec.entrypoints.whisper_options import NAMES, transcribe_options
from encdec.outputs import RequestOutput
from encdec.whisper.transcribe import checked_options
from encdec.whisper.transcript import Segment, Transcription
from encdec.whisper.writers import verbose_json, write_srt, write_vtt

AudioRequest = Union[TranscriptionRequest, TranslationRequest]
# words of transcribe()'s ValueErrors -> the form field at fault, first match wins
ERROR_FIELDS = (("translate", "model"), ("language", "language"), ("initial_prompt", "prompt"))
# the forms' decoding options (language: passed on its own)
OPTION_FIELDS = set(NAMES) & set(TranscriptionRequest.model_fields) - {"language"}
# option names in transcribe_options' errors -> form fields
OPTION_PARAMS = {**{name: name for name in OPTION_FIELDS}, "initial_prompt": "prompt",
                 "word_timestamps": "timestamp_granularities[]", "max_new_tokens": "max_completion_tokens"}


class OpenAIServingTranscription:
    def __init__(self, models: ServedModels, metrics: ServerMetrics, max_upload_bytes: int,
                 max_audio_seconds: float, max_audio_seconds_in_flight: float):
        self.models, self.metrics = models, metrics
        self.max_upload_bytes, self.max_audio_seconds = max_upload_bytes, max_audio_seconds
        self.in_flight = AudioInFlight(max_audio_seconds_in_flight)
        metrics.audio_in_flight.set_function(lambda: self.in_flight.samples / SAMPLE_RATE)

    async def create(self, request: Request, task: str) -> Response:
        form = await read_form(request, self.max_upload_bytes)
        held: Optional[HeldAudio] = None
        try:
            try:
                upload, fields = form_fields(form)
                model = TranscriptionRequest if task == "transcribe" else TranslationRequest
                try:
                    body = model.model_validate(fields)
                except ValidationError as err:
                    raise validation_error(err) from None
                check_request(body)
                options = dict(language=body.language, task=task, **request_options(body))
                served = self.models.get(body.model, whisper=True)
                try:
                    checked_options(served.engine, **options)
                except ValueError as err:
                    raise transcribe_error(err) from err
                # counted from before it decodes at the length its header states, then at its own
                held = self.in_flight.hold(upload_name(upload), await off_loop(
                    stated_samples, upload, self.max_audio_seconds))
                audio = await cancel_on_disconnect(
                    request, off_loop(decode_upload, upload, self.max_audio_seconds))
                held.recount(len(audio))
            finally:
                await form.close()
            options["on_output"] = WindowCounter(self.metrics, served.name, request.state.start_time)
            try:
                if streamed(body):
                    admission = Admission()  # the stream starts once the first window is taken
                    events = self._events(served, held, audio, options, admission, task)
                    stream = await event_stream(request, events, admission)
                    held = None  # the stream's to release when it ends
                    return stream
                result = (await cancel_on_disconnect(
                    request, served.engine.transcribe([(audio, SAMPLE_RATE)], **options)))[0]
            except ValueError as err:
                raise transcribe_error(err) from err
        finally:
            if held is not None:
                held.release()
        self._count_audio(served, result)
        return response(result, body, task)

    def _count_audio(self, served: ServedModel, result: Transcription) -> None:
        self.metrics.audio_seconds.labels(served.name).inc(result.duration)

    async def _events(self, served: ServedModel, held: HeldAudio, audio: np.ndarray, options: dict,
                      admission: Admission, task: str) -> AsyncIterator[str]:
        """A delta per stretch of final segments, then the whole text (and a transcription's
        usage); the upload's audio is counted in flight until the stream ends."""
        with held:
            queue: asyncio.Queue[Optional[list[Segment]]] = asyncio.Queue()
            job = asyncio.ensure_future(served.engine.transcribe(
                [(audio, SAMPLE_RATE)], on_segments=lambda _, segments: queue.put_nowait(segments),
                admission=admission, **options))
            job.add_done_callback(lambda _: queue.put_nowait(None))
            started = False
            try:
                while (segments := await queue.get()) is not None:
                    text = "".join(s.text for s in segments)
                    text = text if started else text.lstrip()
                    if text:
                        started = True
                        yield sse(TranscriptionDelta(delta=text))
                result = job.result()[0]
                self._count_audio(served, result)
                yield sse(TranscriptionDone(text=result.text, usage=usage(result, task)))
                yield DONE
            finally:
                if not job.done():
                    job.cancel()
                    await asyncio.gather(job, return_exceptions=True)


class WindowCounter:
    """Counts a transcription's windows into the metrics as each finishes: their prompt and
    generated tokens and times, and once, the time from the request to the first token of the
    first window to finish."""

    def __init__(self, metrics: ServerMetrics, model: str, start: float):
        self.metrics, self.model, self.start = metrics, model, start
        self.observed = False

    def __call__(self, output: RequestOutput) -> None:
        if not self.observed:
            self.observed = True
            self.metrics.observe_first_token(self.model, output, self.start)
        self.metrics.count_prompt(self.model, output)
        self.metrics.count_generated(self.model, output.outputs)
        self.metrics.observe_finished(self.model, output, max((len(c.token_ids) for c in output.outputs), default=0))


def transcribe_error(err: ValueError) -> OpenAIError:
    """A 400 for a ValueError of `transcribe`: `param` is the form field its message starts
    with, else the one its words point to."""
    error = value_error(err, OPTION_PARAMS)
    if error.param is None:
        error.param = next((f for w, f in ERROR_FIELDS if w in error.message), None)
    return error


def granularities(body: AudioRequest) -> list[str]:
    return getattr(body, "timestamp_granularities", ["segment"])


def check_request(body: AudioRequest) -> None:
    """What the form allows but this server does not do."""
    if isinstance(body, TranscriptionRequest):
        if body.include:
            raise bad_request("include[]=logprobs: OpenAI returns token log-probabilities for its "
                              "gpt-4o transcription models only, not for Whisper; verbose_json's "
                              "segments carry avg_logprob", "include[]")
        if body.timestamp_granularities != ["segment"] and body.response_format != "verbose_json":
            raise bad_request(f"timestamp_granularities[] needs response_format=verbose_json, got "
                              f"{body.response_format!r}", "timestamp_granularities[]")
        if body.hallucination_silence_threshold is not None and "word" not in body.timestamp_granularities:
            raise bad_request("hallucination_silence_threshold needs word timings: "
                              "timestamp_granularities[]=word", "hallucination_silence_threshold")


def streamed(body: AudioRequest) -> bool:
    """Whether to answer with text events: `stream` with json or text; with another format
    `stream` is ignored, as OpenAI ignores it where it cannot stream."""
    return body.stream and body.response_format in ("json", "text")


def request_options(body: AudioRequest) -> dict:
    """`transcribe` options from the form's fields (400 naming the field at fault)."""
    values = body.model_dump(include=OPTION_FIELDS, exclude_unset=True)
    values.update(temperature=body.temperature, initial_prompt=body.prompt or None,  # OpenAI's "": none
                  word_timestamps="word" in granularities(body))
    if body.max_completion_tokens is not None:  # vLLM's name
        values["max_new_tokens"] = body.max_completion_tokens
    vad = getattr(body, "chunking_strategy", None)
    if isinstance(vad, ServerVad):
        values["vad_filter"] = True
        values.update(vad_threshold=vad.threshold, vad_min_silence_duration_ms=vad.silence_duration_ms,
                      vad_speech_pad_ms=vad.prefix_padding_ms)
    try:
        return transcribe_options(values)
    except ValueError as err:
        raise value_error(err, OPTION_PARAMS) from None


def usage(result: Transcription, task: str) -> Optional[TranscriptionUsage]:
    """OpenAI's usage of a transcription: its seconds of audio (none for a translation)."""
    return TranscriptionUsage(seconds=result.duration) if task == "transcribe" else None


def response(result: Transcription, body: AudioRequest, task: str) -> Response:
    response_format = body.response_format
    used = usage(result, task)
    if response_format == "json":
        return JSONResponse({"text": result.text, **({"usage": used.model_dump()} if used else {})})
    if response_format == "text":
        return PlainTextResponse(result.text + "\n")
    if response_format in ("srt", "vtt"):
        out = io.StringIO()
        if response_format == "srt":
            write_srt(result, out)
        else:
            write_vtt(result, out, always_include_hours=True)  # as OpenAI's API writes them
        return PlainTextResponse(out.getvalue(), media_type="text/vtt" if response_format == "vtt" else None)
    kinds = granularities(body)
    data = verbose_json(result, task, segments="segment" in kinds, words="word" in kinds)
    verbose = TranscriptionVerbose(**data, usage=used)
    return JSONResponse(verbose.model_dump(exclude_none=True))
