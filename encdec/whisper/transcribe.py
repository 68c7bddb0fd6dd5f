"""`LLM.transcribe`: audio of any length -> `Transcription`s, every window a request of one batch.

The work is a `TranscriptionJob` (`encdec.whisper.pipeline`: windows, requests, follow-ups,
segments); this module checks the options and drives the job through an engine.
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Callable, Optional

from encdec.audio import load_audio
from encdec.whisper.pipeline import TranscribeOptions, TranscriptionJob
from encdec.whisper.tokens import WhisperTokens, whisper_tokens
from encdec.whisper.transcript import Transcription

TASKS = ("transcribe", "translate")


def transcribe(llm: Any, inputs: Any, language: Optional[str] = None, task: str = "transcribe",
               timestamps: bool = True, initial_prompt: Optional[str] = None,
               on_progress: Optional[Callable[[float], None]] = None, **options: Any) -> list[Transcription]:
    """Transcribe (or translate) each input; returns one `Transcription` per input, in order.

    `inputs` is a path, a `(waveform, sample_rate)` pair, or a list of them. `language` is a
    code ("en", "fr", ...) or None / "auto" to detect it per window (English-only models:
    "en" or None). `on_progress(seconds)` is called as windows finish with the seconds of
    audio finished so far (over all inputs; the last call gives the total duration).
    `options` are the other fields of `TranscribeOptions` (temperature fallback, conditioning
    on previous text, ...).
    """
    engine = llm.llm_engine
    tokens = _model_tokens(engine)
    options = TranscribeOptions(_check_options(tokens, language, task), task, timestamps,
                                initial_prompt, **options)
    sources = _as_input_list(inputs)
    job = TranscriptionJob(tokens, engine.tokenizer, engine.model_config.max_decoder_len,
                           [load_audio(source) for source in sources], options, on_progress)
    run_job(engine, job)
    return job.results([os.fspath(s) if isinstance(s, (str, os.PathLike)) else None for s in sources])


def run_job(engine: Any, job: TranscriptionJob) -> None:
    """Drive `job` through an `LLMEngine` until every window (follow-ups too) is decoded."""
    pending = {}

    def submit(requests) -> None:
        for request in requests:
            engine.add_request(request.request_id, request.prompt, request.params)
            pending[request.request_id] = request

    try:
        submit(job.start())
        while pending:
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    submit(job.finish(pending.pop(out.request_id), out))
    except BaseException:
        for request_id in pending:
            engine.abort_request(request_id)
        raise


def _model_tokens(engine: Any) -> WhisperTokens:
    hf_config = engine.model_config.hf_config
    if getattr(hf_config, "model_type", None) != "whisper":
        raise ValueError(f"transcribe needs a Whisper model, not {engine.model_config.model!r}")
    if engine.tokenizer is None:
        raise ValueError("transcribe needs the model's tokenizer (tokenizer.json) to write text")
    return whisper_tokens(hf_config, engine.tokenizer)


def _check_options(tokens: WhisperTokens, language: Optional[str], task: str) -> Optional[str]:
    """Validate language and task; returns the language to force (None = detect)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    language = None if language in (None, "auto") else language
    if not tokens.multilingual:
        if language not in (None, "en"):
            raise ValueError(f"this Whisper model is English-only: language must be 'en' or "
                             f"None, got {language!r}")
        if task != "transcribe":
            raise ValueError("this Whisper model is English-only: task='translate' needs a "
                             "multilingual model")
        return None
    if language is not None and language not in tokens.lang_to_id:
        raise ValueError(f"language {language!r} is not one of this model's languages: "
                         f"{sorted(tokens.lang_to_id)}")
    if task not in tokens.task_to_id:
        raise ValueError(f"this model has no <|{task}|> token")
    return language


def _as_input_list(inputs: Any) -> list:
    if isinstance(inputs, (str, os.PathLike)) or _is_waveform_pair(inputs):
        return [inputs]
    inputs = list(inputs)
    for i, item in enumerate(inputs):
        if not (isinstance(item, (str, os.PathLike)) or _is_waveform_pair(item)):
            raise ValueError(f"input {i}: expected a path or a (waveform, sample_rate) pair, "
                             f"got {type(item).__name__}")
    return inputs


def _is_waveform_pair(item: Any) -> bool:
    return (isinstance(item, tuple) and len(item) == 2 and not isinstance(item[0], (str, os.PathLike))
            and isinstance(item[1], numbers.Real))
