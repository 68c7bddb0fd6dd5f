"""`LLM.transcribe`: audio of any length -> `Transcription`s, every window a request of one batch.

* Windows: audio longer than 30 s is cut at quiet points (`encdec.whisper.windows`). All
  windows of all inputs go to the engine at once, as independent requests, so they share
  the continuous batch; the transcript merges their segments, shifted by the window offsets.
* Front end: the engine's Whisper audio hook, openai-whisper style (`style="whisper"`: the
  log-mel of the window itself, features zero-padded to 3000 frames), chosen because it
  reproduces faster-whisper's text on short clips; the Hugging Face style changes words.
* Decoding: greedy, with openai-whisper's rules (`encdec.whisper.decoding`), timestamps on by
  default. Each window's prompt ends at <|startoftranscript|> (after `<|startofprev|>` and
  the initial prompt, if any), and its control tokens are forced by `ControlProcessor`, which
  also reads the no-speech probability and, for `language=None` on a multilingual model, the
  language from the same step (`encdec.whisper.control`): one encoder run per window.
* No speech: silent windows (below -60 dBFS) are not decoded; a decoded window is dropped
  when `no_speech_prob > 0.6` and its decode is unsure: `avg_logprob < -1` (openai-whisper's
  rule) or a compression ratio above 2.4 (`encdec.whisper.silence`). `avg_logprob` is the
  sampled tokens' log-probability sum over (their number + 1), forced tokens excluded.
* Windows are decoded in parallel, so none is conditioned on another's text; the initial
  prompt conditions every window.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from encdec.audio import SAMPLE_RATE, load_audio
from encdec.outputs import RequestOutput
from encdec.sampling.params import SamplingParams
from encdec.whisper.control import ControlProcessor, WindowState, control_prefix
from encdec.whisper.decoding import DecodingRules
from encdec.whisper.segments import decode_text, window_segments
from encdec.whisper.silence import is_no_speech, is_silent
from encdec.whisper.tokens import WhisperTokens, whisper_tokens
from encdec.whisper.transcript import Segment, Transcription
from encdec.whisper.windows import split_windows

SAMPLE_LEN = 224  # tokens sampled per window at most (openai: n_text_ctx // 2)
MAX_PROMPT_TOKENS = 223  # initial-prompt tokens kept (openai: n_text_ctx // 2 - 1)
TASKS = ("transcribe", "translate")


@dataclass
class _Window:
    """One stretch of one input: its audio, what the control steps found, its segments."""

    input_index: int
    offset: float  # seconds from the input's start
    audio: np.ndarray
    state: WindowState
    segments: list[Segment] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def transcribe(llm: Any, inputs: Any, language: Optional[str] = None, task: str = "transcribe",
               timestamps: bool = True, initial_prompt: Optional[str] = None,
               on_progress: Optional[Callable[[float], None]] = None) -> list[Transcription]:
    """Transcribe (or translate) each input; returns one `Transcription` per input, in order.

    `inputs` is a path, a `(waveform, sample_rate)` pair, or a list of them. `language` is a
    code ("en", "fr", ...) or None / "auto" to detect it per window (English-only models:
    "en" or None). `on_progress(seconds)` is called as windows finish with the seconds of
    audio finished so far (over all inputs; the last call gives the total duration).
    """
    engine = llm.llm_engine
    tokens = _model_tokens(engine)
    language = _check_options(tokens, language, task)
    sources = _as_input_list(inputs)
    audios = [load_audio(source) for source in sources]
    known_language = language if tokens.multilingual else "en"
    windows = [_Window(index, start / SAMPLE_RATE, audio[start:end], WindowState(language=known_language))
               for index, audio in enumerate(audios) for start, end in split_windows(audio)]
    voiced = [w for w in windows if not is_silent(w.audio)]
    prefix = control_prefix(tokens, language, task, timestamps)
    request_ids = _add_requests(llm, voiced, tokens, prefix, DecodingRules(tokens, timestamps),
                                _decoder_prompt(tokens, engine.tokenizer, initial_prompt))
    silent_seconds = sum(w.duration for w in windows) - sum(w.duration for w in voiced)
    outputs = llm._run_engine(request_ids, use_tqdm=False,
                              on_output=_progress(request_ids, voiced, silent_seconds, on_progress))
    for out, window in zip(outputs, voiced):
        window.segments = _segments(out, window, len(prefix), tokens, engine.tokenizer)
    return [_transcription(source, audio, [w for w in windows if w.input_index == index])
            for index, (source, audio) in enumerate(zip(sources, audios))]


def _add_requests(llm: Any, windows: list[_Window], tokens: WhisperTokens, prefix: list,
                  rules: DecodingRules, prompt: list[int]) -> list[str]:
    """One greedy request per window, its control steps and rules in a logits processor."""
    max_tokens = min(len(prefix) + SAMPLE_LEN, llm.llm_engine.model_config.max_decoder_len - len(prompt))
    if max_tokens <= len(prefix):
        raise ValueError(f"initial_prompt leaves no room to decode ({len(prompt)} prompt tokens)")
    if not windows:
        return []
    prompts = [{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (w.audio, SAMPLE_RATE)}},
                "decoder_prompt": prompt} for w in windows]
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens,
                             logits_processors=[ControlProcessor(tokens, prefix, rules, w.state)])
              for w in windows]
    return llm._add_requests(prompts, params)


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


def _decoder_prompt(tokens: WhisperTokens, tokenizer: Any, initial_prompt: Optional[str]) -> list[int]:
    """[<|startofprev|>, last 223 tokens of " " + prompt, sot], or just [sot]."""
    if initial_prompt is None or not initial_prompt.strip():
        return [tokens.sot]
    if tokens.sot_prev is None:
        raise ValueError("this Whisper vocabulary has no <|startofprev|>: initial_prompt unsupported")
    ids = tokenizer(" " + initial_prompt.strip(), add_special_tokens=False)["input_ids"]
    return [tokens.sot_prev, *ids[-MAX_PROMPT_TOKENS:], tokens.sot]


def _progress(request_ids: list[str], windows: list[_Window], done: float,
              on_progress: Optional[Callable[[float], None]]) -> Optional[Callable[[RequestOutput], None]]:
    """Report `done` (the silent windows, skipped) now, then add each window as it finishes."""
    if on_progress is None:
        return None
    if done > 0:
        on_progress(done)
    durations = {r: w.duration for r, w in zip(request_ids, windows)}

    def on_output(out: RequestOutput) -> None:
        nonlocal done
        done += durations[out.request_id]
        on_progress(done)

    return on_output


def _segments(out: RequestOutput, window: _Window, num_forced: int, tokens: WhisperTokens,
              tokenizer: Any) -> list[Segment]:
    completion = out.outputs[0]
    sampled = completion.token_ids[num_forced:]
    num_text = len(sampled) - (1 if sampled and sampled[-1] == tokens.eot else 0)
    avg_logprob = completion.cumulative_logprob / (num_text + 1)
    no_speech = window.state.no_speech_prob
    if is_no_speech(no_speech, avg_logprob, decode_text(tokenizer, sampled, tokens)):
        return []
    return window_segments(sampled, tokens, tokenizer, window.offset, window.duration,
                           avg_logprob, no_speech)


def _transcription(source: Any, audio: np.ndarray, windows: list[_Window]) -> Transcription:
    """Merge one input's windows; its language is that of its first window with speech."""
    segments = [seg for w in windows for seg in w.segments]
    spoken = [w for w in windows if w.segments] or windows
    return Transcription(text="".join(s.text for s in segments).strip(),
                         language=spoken[0].state.language, segments=segments,
                         duration=len(audio) / SAMPLE_RATE,
                         source=os.fspath(source) if isinstance(source, (str, os.PathLike)) else None)
