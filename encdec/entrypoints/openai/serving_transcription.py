"""`POST /v1/audio/transcriptions` and `/v1/audio/translations` (OpenAI's multipart forms).

The upload is decoded off the event loop, then transcribed through the model's engine with
`AsyncLLMEngine.transcribe`: its windows share the engine's batch with every other upload in
flight. `temperature` t means openai-whisper's fallback from t up to 1.0 in steps of 0.2
(OpenAI: 0 "increases the temperature until certain thresholds are hit"). Streamed
transcriptions send a `transcript.text.delta` event as each stretch of segments is final,
then one `transcript.text.done`.
"""
from __future__ import annotations

import asyncio
import io
from typing import AsyncIterator, Optional, Union

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from transformers.models.whisper.tokenization_whisper import LANGUAGES

from encdec.audio import SAMPLE_RATE
from encdec.entrypoints.openai.errors import bad_request, validation_error
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.protocol import (TranscriptionDelta, TranscriptionDone,
                                                TranscriptionRequest, TranscriptionSegment,
                                                TranscriptionUsage, TranscriptionVerbose,
                                                TranslationRequest)
from encdec.entrypoints.openai.serving_models import ServedModel, ServedModels
from encdec.entrypoints.openai.streaming import DONE, cancel_on_disconnect, event_stream, sse
from encdec.entrypoints.openai.uploads import decode_upload_async, form_fields, read_form
from encdec.whisper.transcript import Segment, Transcription
from encdec.whisper.writers import write_srt, write_vtt

AudioRequest = Union[TranscriptionRequest, TranslationRequest]
# words of transcribe()'s ValueErrors -> the form field at fault, first match wins
ERROR_FIELDS = (("translate", "model"), ("language", "language"), ("initial_prompt", "prompt"))
FALLBACK_STEP = 0.2


def temperatures(start: float) -> tuple[float, ...]:
    """openai-whisper's fallback temperatures from `start`: start, start + 0.2, ... <= 1.0."""
    steps = int((1.0 - start) / FALLBACK_STEP + 1e-6)
    return tuple(round(start + FALLBACK_STEP * i, 6) for i in range(steps + 1))


class OpenAIServingTranscription:
    def __init__(self, models: ServedModels, metrics: ServerMetrics, max_upload_bytes: int,
                 max_audio_seconds: float):
        self.models, self.metrics = models, metrics
        self.max_upload_bytes, self.max_audio_seconds = max_upload_bytes, max_audio_seconds

    async def create(self, request: Request, task: str) -> Response:
        form = await read_form(request, self.max_upload_bytes)
        try:
            upload, fields = form_fields(form)
            model = TranscriptionRequest if task == "transcribe" else TranslationRequest
            try:
                body = model.model_validate(fields)
            except ValidationError as err:
                raise validation_error(err) from None
            check_request(body)
            served = self.models.get(body.model, whisper=True)
            audio = await cancel_on_disconnect(
                request, decode_upload_async(upload, self.max_audio_seconds))
        finally:
            await form.close()
        language = getattr(body, "language", None)
        options = dict(language=language, task=task, initial_prompt=body.prompt,
                       temperature=temperatures(body.temperature))
        try:
            if getattr(body, "stream", False):
                return await event_stream(request, self._events(served, audio, options))
            result = (await cancel_on_disconnect(
                request, served.engine.transcribe([(audio, SAMPLE_RATE)], **options)))[0]
        except ValueError as err:
            message = str(err)
            raise bad_request(message, next((f for w, f in ERROR_FIELDS if w in message), None)) from err
        self._count(served, result)
        return response(result, body.response_format, task)

    def _count(self, served: ServedModel, result: Transcription) -> None:
        self.metrics.audio_seconds.labels(served.name).inc(result.duration)
        self.metrics.generation_tokens.labels(served.name).inc(sum(len(s.tokens) for s in result.segments))

    async def _events(self, served: ServedModel, audio: np.ndarray, options: dict) -> AsyncIterator[str]:
        """A delta per stretch of final segments, then the whole text."""
        queue: asyncio.Queue[Optional[list[Segment]]] = asyncio.Queue()
        job = asyncio.ensure_future(served.engine.transcribe(
            [(audio, SAMPLE_RATE)], on_segments=lambda _, segments: queue.put_nowait(segments), **options))
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
            self._count(served, result)
            yield sse(TranscriptionDone(text=result.text))
            yield DONE
        finally:
            if not job.done():
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)


def check_request(body: AudioRequest) -> None:
    """What the form allows but this server does not do."""
    if isinstance(body, TranscriptionRequest):
        if "word" in body.timestamp_granularities:
            raise bad_request("word timestamps are not available yet: ask for "
                              "timestamp_granularities[]=segment", "timestamp_granularities[]")
        if body.stream and body.response_format not in ("json", "text"):
            raise bad_request(f"stream=true sends text events: response_format must be json or "
                              f"text, got {body.response_format!r}", "stream")


def response(result: Transcription, response_format: str, task: str) -> Response:
    if response_format == "json":
        return JSONResponse({"text": result.text})
    if response_format == "text":
        return PlainTextResponse(result.text + "\n")
    if response_format in ("srt", "vtt"):
        out = io.StringIO()
        (write_srt if response_format == "srt" else write_vtt)(result, out)
        return PlainTextResponse(out.getvalue(), media_type="text/vtt" if response_format == "vtt" else None)
    return JSONResponse(verbose(result, task).model_dump())


def verbose(result: Transcription, task: str) -> TranscriptionVerbose:
    """OpenAI's verbose_json: full language name, duration in seconds, all segment fields."""
    language = "english" if task == "translate" else LANGUAGES.get(result.language or "", result.language or "")
    segments = [TranscriptionSegment(id=i, seek=s.seek, start=s.start, end=s.end, text=s.text,
                                     tokens=s.tokens, temperature=s.temperature,
                                     avg_logprob=s.avg_logprob, compression_ratio=s.compression_ratio,
                                     no_speech_prob=s.no_speech_prob)
                for i, s in enumerate(result.segments)]
    return TranscriptionVerbose(task=task, language=language, duration=result.duration,
                                text=result.text, segments=segments,
                                usage=TranscriptionUsage(seconds=result.duration))
