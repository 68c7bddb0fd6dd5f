"""Transcription drivers: audio of any length -> `Transcription`s, every window a request.

The work is a `TranscriptionJob` (`encdec.whisper.pipeline`: windows, requests, follow-ups,
segments); this module checks the options and drives the job through an engine, written
against what both engines offer in public: `model_config`, `tokenizer`, the model for word
alignment (`model_runner.model`; the async engine's through its `engine`), and either
`add_request` / `step` / `abort_request` (`LLMEngine`, for `LLM.transcribe`) or
`generate` (`AsyncLLMEngine`, for `AsyncLLMEngine.transcribe`). Both give the same transcript.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

import numpy as np
import torch

from encdec.audio import SAMPLE_RATE, load_audio
from encdec.engine.async_engine import Admission
from encdec.outputs import RequestOutput
from encdec.whisper.languages import AUTO, requested_language
from encdec.whisper.options import InitialPrompt, TranscribeOptions
from encdec.whisper.pipeline import TranscriptionJob
from encdec.whisper.prompts import prompt_ids
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Segment, Transcription
from encdec.worker.cpu_memory import release_free_memory

TASKS = ("transcribe", "translate")
# faster-whisper's names for what encdec spells otherwise
RENAMED = {"log_prob_threshold": "logprob_threshold", "without_timestamps": "timestamps=False"}
EXPECTED = ("a path (str or os.PathLike), a binary file object, a 16 kHz waveform (array or tensor) or a "
            "(waveform, sample_rate) pair")


def transcribe(llm: Any, inputs: Any, language: Optional[str] = None, task: str = "transcribe",
               timestamps: bool = True, initial_prompt: InitialPrompt = None,
               on_progress: Optional[Callable[[float], None]] = None, report: Optional[Callable] = None,
               **options: Any) -> list[Transcription]:
    """Transcribe (or translate) each input; returns one `Transcription` per input, in order.

    `inputs` is a path, a binary file object (as faster-whisper takes), a 16 kHz waveform (a 1-D
    array or tensor, as openai-whisper takes), a `(waveform, sample_rate)` pair, or a list of them. `language` is a code ("en", "fr", ...)
    or a name ("English", "french") or None / "auto" to detect it on each input's first 30 s
    (English-only models: English or None). `on_progress(seconds)` is called as windows finish
    with the seconds of audio finished so far (over all inputs; the last call gives the total
    duration).
    `options` are the other fields of `TranscribeOptions` (temperature fallback, conditioning
    on previous text, ...). `report(names, total_seconds, on_progress)`, if given, is a context
    manager around the run that yields its `(on_progress, on_segments, on_language)` (what
    `LLM.transcribe`'s `verbose` prints: `encdec.entrypoints.whisper_console`).
    """
    engine = llm.llm_engine
    sources = _as_input_list(inputs)
    audios = _load_all(sources)
    names = [name or f"input {i}" for i, name in enumerate(_names(sources))]
    seconds = sum(len(audio) for audio in audios) / SAMPLE_RATE
    callbacks = (contextlib.nullcontext((on_progress, None, None)) if report is None
                 else report(names, seconds, on_progress))
    with callbacks as (progress, segments, languages):
        job = make_job(engine, audios, language, task, timestamps, initial_prompt, progress, segments,
                       options, languages)
        run_job(engine, job, word_aligner(engine.model_runner.model, engine.model_config))
    return job.results(_names(sources))


async def transcribe_async(engine: Any, inputs: Any, language: Optional[str] = None,
                           task: str = "transcribe", timestamps: bool = True,
                           initial_prompt: InitialPrompt = None,
                           on_progress: Optional[Callable[[float], None]] = None,
                           on_segments: Optional[Callable[[int, list[Segment]], None]] = None,
                           on_output: Optional[Callable[[RequestOutput], None]] = None,
                           admission: Optional[Admission] = None, **options: Any) -> list[Transcription]:
    """`transcribe` through an `AsyncLLMEngine`: its windows join the engine's batch with every
    other caller's requests; audio decoding and the job's set-up (voice activity detection,
    window cuts) run off the event loop. `on_segments(index, segments)` gets each input's
    segments in time order as they are final (`TranscriptionJob`); `on_output` each window's
    final engine output (the server's metrics); `admission` is the job's (the server's, which
    starts its stream once the first window is taken)."""
    sources = _as_input_list(inputs)
    loop = asyncio.get_running_loop()

    # The audio and its spectra are freed in worker threads, whose heaps glibc keeps: they are
    # given back after the set-up and at the end (measured on test_server_load's second round
    # of uploads: RSS +54-128 MB without, +8-19 MB with, as when spectra were taken per window).
    def set_up() -> TranscriptionJob:
        made = make_job(engine, _load_all(sources), language, task, timestamps, initial_prompt,
                        on_progress, on_segments, options, None)
        release_free_memory()
        return made

    job = await loop.run_in_executor(None, set_up)
    try:
        await run_job_async(engine, job, word_aligner(engine.engine.model_runner.model, engine.model_config),
                            on_output, admission)
        return job.results(_names(sources))
    finally:
        del job
        loop.run_in_executor(None, release_free_memory)


def make_job(engine: Any, audios: list, language: Optional[str], task: str, timestamps: bool,
             initial_prompt: InitialPrompt, on_progress: Optional[Callable[[float], None]],
             on_segments: Optional[Callable[[int, list[Segment]], None]], options: dict,
             on_language: Optional[Callable[[int, str], None]]) -> TranscriptionJob:
    """A job for `engine`'s Whisper model, its options checked (`checked_options`)."""
    checked = checked_options(engine, language, task, timestamps, initial_prompt, **options)
    config = engine.model_config
    return TranscriptionJob(_model_tokens(engine), engine.tokenizer, config.max_decoder_len, audios, checked,
                            on_progress, on_segments, config.hf_config.num_mel_bins, on_language)


def checked_options(engine: Any, language: Optional[str] = None, task: str = "transcribe",
                    timestamps: bool = True, initial_prompt: InitialPrompt = None,
                    **options: Any) -> TranscribeOptions:
    """`transcribe`'s options checked against `engine`'s model and against what it runs at once
    (the fallback's default samples shrink to fit a smaller `max_num_seqs`); needs no audio, so
    a server refuses bad options before it decodes an upload. ValueError names the option."""
    known = {f.name for f in dataclasses.fields(TranscribeOptions)}
    for name in sorted(set(options) - known):
        hint = f"use {RENAMED[name]}" if name in RENAMED else "it is not one encdec takes (see TranscribeOptions)"
        raise ValueError(f"unknown transcribe option {name!r}: {hint}")
    tokens = _model_tokens(engine)
    max_num_seqs = engine.scheduler_config.max_num_seqs
    options = {"best_of": min(TranscribeOptions.best_of, max_num_seqs), **options}
    checked = TranscribeOptions(_check_options(tokens, language, task), task, timestamps,
                                initial_prompt, **options)
    _check_engine_limits(checked, engine)
    for name in ("initial_prompt", "hotwords"):  # within the model's vocabulary
        prompt_ids(tokens, engine.tokenizer, getattr(checked, name), name)
    return checked


def word_aligner(model: Any, model_config: Any) -> Callable:
    """`TranscriptionJob.align`'s aligner: the model's teacher-forced pass over its alignment heads."""
    from encdec.models.whisper_alignment import alignment_pass

    heads = list(model_config.special_tokens.alignment_heads)
    return lambda token_ids, cross_kvs: alignment_pass(model, token_ids, cross_kvs, heads)


def run_job(engine: Any, job: TranscriptionJob, aligner: Optional[Callable] = None) -> None:
    """Drive `job` through an `LLMEngine` until every window (follow-ups too) is decoded."""
    pending = {}

    def submit(requests) -> None:
        for request in requests:
            engine.add_request(request.request_id, request.prompt, request.params, arrival_time=job.arrival_time,
                               return_cross_kv=job.return_cross_kv(request))
            pending[request.request_id] = request

    try:
        submit(job.start())
        while pending:
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    submit(job.finish(pending.pop(out.request_id), out))
            for request_id, error in engine.take_failures().items():
                pending.pop(request_id, None)
                raise error
            if aligner is not None and job.unaligned:
                batch, sequences, cross_kvs = job.alignment_batch()
                submit(job.align(batch, aligner(sequences, cross_kvs)))
    except BaseException:
        for request_id in pending:
            engine.abort_request(request_id)
        raise


async def run_job_async(engine: Any, job: TranscriptionJob, aligner: Optional[Callable] = None,
                        on_output: Optional[Callable[[RequestOutput], None]] = None,
                        admission: Optional[Admission] = None) -> None:
    """Drive `job` through an `AsyncLLMEngine`: each window a task; cancelling aborts them all.
    Its windows are one job (`admission`, a new one by default), taken or refused
    (`EngineOverloaded`) whole. Alignment passes run off the event loop; `on_output` gets each
    window's final output."""
    admission = Admission() if admission is None else admission

    async def decode(request):
        final = None
        async for out in engine.generate(request.prompt, request.params, request.request_id,
                                         return_cross_kv=job.return_cross_kv(request), admission=admission,
                                         arrival_time=job.arrival_time):
            final = out
        return request, final

    loop = asyncio.get_running_loop()
    first = job.start()
    if not admission.admitted:  # the windows that start together are weighed together
        admission.size = max(1, len(first))
    pending = {asyncio.ensure_future(decode(r)) for r in first}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # every failure read (windows refused together each raise), the first one raised
            if failure := next(filter(None, [task.exception() for task in done]), None):
                raise failure
            for task in done:
                request, final = task.result()
                if on_output is not None:
                    on_output(final)
                pending |= {asyncio.ensure_future(decode(r)) for r in job.finish(request, final)}
            if aligner is not None and job.unaligned:  # the model's pass off the loop, the rest on it
                batch, sequences, cross_kvs = job.alignment_batch()
                results = await loop.run_in_executor(None, aligner, sequences, cross_kvs)
                pending |= {asyncio.ensure_future(decode(r)) for r in job.align(batch, results)}
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _names(sources: list) -> list[Optional[str]]:
    return [os.fspath(s) if isinstance(s, (str, os.PathLike)) else None for s in sources]


def _model_tokens(engine: Any) -> WhisperTokens:
    tokens = engine.model_config.special_tokens
    if not isinstance(tokens, WhisperTokens):
        raise ValueError(f"transcribe needs a Whisper model, not {engine.model_config.model!r}")
    if engine.tokenizer is None:
        raise ValueError("transcribe needs the model's tokenizer (tokenizer.json) to write text")
    return tokens


def _check_engine_limits(options: TranscribeOptions, engine: Any) -> None:
    """Token ids within the vocabulary; beams and fallback samples within `max_num_seqs`, and
    within the cache for a window of any audio (one decoding to the decoder's last position):
    refused with the options, not when a window that needs them comes."""
    config = engine.model_config
    vocab_size = config.vocab_size
    for token in options.suppress_tokens:
        if not (token == -1 or 0 <= token < vocab_size):
            raise ValueError(f"suppress_tokens: {token} is neither -1 nor a token id of this model "
                             f"(vocab_size={vocab_size})")
    samples = options.best_of if any(t > 0 for t in options.temperature) else 1
    for name, count in (("beam_size", options.beam_size or 1), ("best_of", samples)):
        engine.scheduler_config.check_num_seqs(count, f"{name}={count}")
        engine.check_can_ever_fit(config.max_encoder_len, config.max_decoder_len, count, f"{name}={count}")


def _check_options(tokens: WhisperTokens, language: Optional[str], task: str) -> Optional[str]:
    """Validate language and task; returns the language to force (None = detect)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    language = None if language == AUTO else requested_language(language)
    if not tokens.multilingual:
        if language not in (None, "en"):
            raise ValueError(f"this Whisper model is English-only: language must be 'en' or "
                             f"None, got {language!r}")
        if task != "transcribe":
            raise ValueError("this Whisper model is English-only: task='translate' needs a "
                             "multilingual model")
        return None
    tokens.decoder_prefix(language, task)  # refuses a language or task the model lacks
    return language


def _as_input_list(inputs: Any) -> list:
    """`inputs` as a list of paths, waveforms and `(waveform, sample_rate)` pairs. A waveform
    alone (an array or tensor) is one input (at 16 kHz, as in openai-whisper); a tuple
    `(waveform, x)` with `x` no waveform is a pair (`load_audio` checks the rest)."""
    if _is_input(inputs):
        return [inputs]
    if not isinstance(inputs, Iterable) or isinstance(inputs, (bytes, bytearray, Mapping)):
        raise ValueError(f"inputs must be {EXPECTED}, or a list of them, got {type(inputs).__name__}")
    inputs = list(inputs)
    for i, item in enumerate(inputs):
        if not _is_input(item):
            raise ValueError(f"input {i}: expected {EXPECTED}, got {type(item).__name__}")
    return inputs


def _is_input(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike, np.ndarray, torch.Tensor)) or hasattr(item, "read") or (
        isinstance(item, tuple) and len(item) == 2 and not isinstance(item[0], (str, bytes, os.PathLike, tuple))
        and not isinstance(item[1], (os.PathLike, tuple, list)) and np.ndim(item[1]) == 0)


def _load_all(sources: list) -> list[np.ndarray]:
    """Each source's 16 kHz waveform (none at all: an empty transcript, as the references give);
    with several, an error says which input it is about."""
    audios = []
    for i, source in enumerate(sources):
        try:
            audios.append(load_audio(source, allow_empty=True))
        except ValueError as error:
            if len(sources) == 1:
                raise
            raise type(error)(f"input {i}: {error}") from error
    return audios
