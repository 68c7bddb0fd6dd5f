"""Transcription as requests: audio windows in, engine requests out, segments back.

`TranscriptionJob` knows nothing of how requests run: a driver submits what `start()` returns,
hands each finished output to `finish()`, submits the follow-ups that returns, and reads
`results()` when nothing is left (`encdec.whisper.transcribe` has the drivers). So the same
job runs under the offline `LLM` and under the async engine, and a window can be submitted
when another one finishes, while other files' windows keep the batch full.

* Windows: an input's next window starts where its last decode left off and runs 30 s or to its
  clip's end (`plan_seek`, openai-whisper's `seek`). With `windows_at_once`, audio longer than
  30 s is cut at quiet points (`encdec.whisper.windows`)
  and a window whose decode stops short gets a follow-up window for the rest of its audio
  (`plan_window`; both in `encdec.whisper.coverage`). Windows are decoded with timestamp
  tokens whenever the vocabulary has them, also for a transcript without timestamps: they
  show where a decode stopped.
* Front end: as in openai-whisper and faster-whisper, one log-mel per input
  (`encdec.audio.input_features`); each window's request carries its frames of it (zero-padded
  to 3000 by the engine's Whisper audio hook), so a window past the input's start sees the
  samples before it and shares the input's clamp.
* Decoding: greedy with temperature fallback (`TranscribeOptions`), with openai-whisper's
  rules (`encdec.whisper.decoding`). A decode that fails gets its window's cross-attention
  keys and values from the engine (`TranscriptionJob.return_cross_kv`), and the window's
  decodes at higher temperatures reuse them (a `CrossKVPrompt`): one encoder run per window,
  as faster-whisper reuses its encoder output. Each window's prompt ends at
  <|startoftranscript|> (after `<|startofprev|>` and the initial prompt, if any); its control
  tokens are forced by `ControlProcessor`, which also reads the no-speech probability from the
  same step (`encdec.whisper.control`).
* Language (`language=None` on a multilingual model): one detection request per input, on its
  first 30 s from its first clip's start, the decoder prompt <|startoftranscript|> alone, as
  faster-whisper detects it; all the input's windows wait for it and are decoded in that
  language. The input's first window takes the detection's cross cache when it has the same
  frames (a seek window's first 30 s do, unless its clip ends sooner), so that too is one
  encoder run.
* No speech: silent windows (below -84 dBFS) are not decoded; a decoded window is dropped
  when `no_speech_prob > 0.6` and its decode is unsure (`encdec.whisper.silence`).
  `avg_logprob` is the sampled tokens' log-probability sum over (their number + 1).
* Conditioning (`condition_on_previous_text`, on by default as in openai-whisper and
  faster-whisper): each window is prompted with the text kept so far. An input's windows run
  one after another, the windows of other inputs filling the batch meanwhile; with
  `windows_at_once` (never conditioned) every window of every input runs at once.

Measured before the windows followed the decodes (conditioned windows were cut at quiet
points too; they now give openai-whisper's segments on those clips) on the long clips of
`tests/whisper/test_long_audio.py` (377 s, 91 sentences; WER, sentences lost in brackets),
greedy, the same weights:

| tiny.en / base                        | timestamps        | no timestamps     |
|---------------------------------------|-------------------|-------------------|
| windows at once, no repair (before)   | 14.4% (1) / 12.6% (4) | 26.1% (6) / 9.4% (0) |
| windows at once, repair loop          | 13.7% (0) / 9.4% (0)  | same text         |
| conditioned windows, repair loop      | 11.9% (0) / 8.1% (0)  | same text         |
| faster-whisper WhisperModel           | 12.7% / 8.3%      |                   |
| faster-whisper, not conditioned       | 13.5% / 8.1%      |                   |
| faster-whisper BatchedInferencePipeline | 13.7% / -       |                   |

On three more clips (484 s) tiny.en/base: at once 13.2%/10.0%, conditioned 12.4%/9.0%,
faster-whisper 11.7%/8.9% (not conditioned 13.2%/8.9%). So the repair loop brings back every
lost sentence, and conditioning is what closes the last point to faster-whisper's default;
windows at once stay for speed on one long input (`windows_at_once=True`).
Without timestamps the decode used to stop after the first of three utterances in a window or
start 12 s late; decoding with timestamps and printing none loses nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np

from encdec.audio import CHUNK_LENGTH, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, input_features
from encdec.generation_config import decoder_room
from encdec.outputs import RequestOutput
from encdec.sampling.params import RequestOutputKind, SamplingParams, max_candidates
from encdec.whisper.control import DETECT, ControlProcessor, WindowState, control_prefix
from encdec.whisper.coverage import MAX_FOLLOW_UPS, plan_seek, plan_window, repeated_words, words
from encdec.whisper.decoding import TIME_PRECISION, DecodingRules
from encdec.whisper.options import TranscribeOptions
from encdec.whisper.penalties import OutputPenalties
from encdec.whisper.prompts import MAX_PROMPT_TOKENS, decoder_prompt, prompt_ids
from encdec.whisper.segments import (Span, clear_empty_segments, decode_text, span_tokens, split_spans,
                                     window_segments)
from encdec.whisper.silence import compression_ratio, is_no_speech, is_silent
from encdec.whisper.tokens import WhisperTokens
from encdec.whisper.transcript import Segment, Transcription
from encdec.whisper.timing import align_words, hallucination_index, is_anomaly, speech_end, words_into_segments
from encdec.whisper.vad import SpeechMap, VadOptions
from encdec.whisper.windows import split_windows

SAMPLE_LEN = 224  # tokens sampled per window at most (openai: n_text_ctx // 2)
MAX_CONTROL_TOKENS = 3  # <|lang|> <|task|> <|notimestamps|> at most, after the prompt


@dataclass
class Decode:
    """One decode of a window: its sampled tokens (after the forced ones) and their scores."""

    sampled: list[int]
    text: str
    avg_logprob: float
    temperature: float

    @property
    def compression_ratio(self) -> float:
        """Of the text without its outer spaces, as openai-whisper and faster-whisper count it."""
        return compression_ratio(self.text.strip())


@dataclass
class Window:
    """A stretch `[start, end)` (samples) of one input, what its control steps found, and the
    segments kept from its decode; `follow_ups` counts the windows before it in its chain."""

    input_index: int
    start: int
    end: int
    state: WindowState
    follow_ups: int = 0
    previous_text: str = ""  # a follow-up's: the text kept before it in its chain
    context: Optional[list[int]] = None  # its own prompt context, not its input's
    cross_kv: Any = None  # its cross-attention keys and values: fallbacks and word alignment
    resume: Optional[int] = None  # seek windows waiting for words: where the next one starts
    kept: list[Span] = field(default_factory=list)  # seek windows: the spans of its segments (the prompt context)
    decodes: list[Decode] = field(default_factory=list)  # one per temperature tried
    segments: list[Segment] = field(default_factory=list)
    done: bool = False  # decoded (or silent): its segments are final
    reported: bool = False  # its segments went to `on_segments`

    @property
    def offset(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


@dataclass
class WindowRequest:
    """One engine request of a job: what to submit, and the window it decodes."""

    request_id: str
    prompt: dict
    params: SamplingParams
    window: Window
    num_forced: int  # control tokens forced after the prompt, before the sampled ones
    # whether the driver asks the engine for the window's cross cache: "always" (word
    # timestamps), "if it fails" (a fallback would decode it again) or "never"
    return_cross_kv: str = "never"
    detects: bool = False  # it detects the language of `window`'s input (`window` is not decoded)


class TranscriptionJob:
    """The windows of some audio inputs, as engine requests; see the module docstring.

    `tokens`, `tokenizer`, `max_decoder_len` and `n_mels` come from the model; `audios` are
    16 kHz mono waveforms. `on_progress(seconds)` is called as windows finish, with the seconds
    of audio covered so far over all inputs (the last call gives the total). `on_segments(index,
    segments)` gets an input's segments in time order as soon as everything before them is
    decoded (for streaming a transcript); `on_language(index, code)` an input's detected language.
    """

    def __init__(self, tokens: WhisperTokens, tokenizer: Any, max_decoder_len: int,
                 audios: list[np.ndarray], options: TranscribeOptions,
                 on_progress: Optional[Callable[[float], None]] = None,
                 on_segments: Optional[Callable[[int, list[Segment]], None]] = None, n_mels: int = 80,
                 on_language: Optional[Callable[[int, str], None]] = None):
        for name, callback in (("on_progress", on_progress), ("on_segments", on_segments),
                               ("on_language", on_language)):
            if callback is not None and not callable(callback):
                raise ValueError(f"{name} must be a function or None, got {callback!r}")
        self.tokens = tokens
        self.tokenizer = tokenizer
        self.options = options
        # Windows are decoded with timestamp tokens whenever the vocabulary has them, also when
        # the transcript is to have none: they are what shows a decode stopped short.
        self.decode_timestamps = tokens.timestamp_begin is not None
        self.rules = DecodingRules(tokens, self.decode_timestamps, suppress_tokens=options.suppress_tokens,
                                   suppress_blank=options.suppress_blank)
        penalties = OutputPenalties(options.repetition_penalty, options.no_repeat_ngram_size,
                                    options.presence_penalty, options.frequency_penalty)
        self.penalties = [penalties] if penalties.active else []
        self.max_decoder_len = max_decoder_len
        self.initial = prompt_ids(tokens, tokenizer, options.initial_prompt, "initial_prompt")
        # faster-whisper's: empty hotwords are none
        self.hotwords = prompt_ids(tokens, tokenizer, options.hotwords or None, "hotwords")[:MAX_PROMPT_TOKENS]
        if self._max_tokens(self._decoder_prompt(list(self.initial))) <= 0:
            raise ValueError(f"initial_prompt and hotwords leave no room to decode "
                             f"({len(self.initial) + len(self.hotwords)} prompt tokens)")
        self.durations = [len(audio) / SAMPLE_RATE for audio in audios]
        self.speech_maps: list[Optional[SpeechMap]] = [None] * len(audios)
        if options.vad_filter:  # after the checks: VAD runs over all the audio
            self.speech_maps = [SpeechMap(audio, options.vad_parameters or VadOptions()) for audio in audios]
            audios = [speech.audio for speech in self.speech_maps]
        self.audios = audios
        self.features = [input_features(audio, n_mels) for audio in audios]
        self.context = [list(self.initial) for _ in audios]  # per input: the tokens to condition on
        # per input: its language (None until detected, `_detection_request`), and the detection's
        # probability (1 for a language given or an English-only model, as faster-whisper says)
        self.languages = [options.language if tokens.multilingual else "en"] * len(audios)
        self.language_probabilities = [1.0] * len(audios)
        self.clips = [_clips(audio, options.clip_timestamps) for audio in audios]  # per input, in samples
        # unless at once, an input's windows follow its decodes (`plan_seek`): each clip's first is
        # made here
        self.seek = not options.windows_at_once
        cuts = (lambda clip: [(0, min(len(clip), N_SAMPLES))]) if self.seek else split_windows
        self.windows = [Window(index, clip_start + start, clip_start + end, WindowState())
                        for index, audio in enumerate(audios) for clip_start, clip_end in self.clips[index]
                        for start, end in cuts(audio[clip_start:clip_end])]
        self.queued: list[list[Window]] = [[] for _ in audios]  # windows waiting for their language or turn
        self.on_progress = on_progress
        self.on_segments = on_segments
        self.on_language = on_language
        self.unaligned: list[tuple[Window, Decode]] = []  # decoded windows waiting for `align`
        self.last_speech = [0.0] * len(audios)  # per input: where its aligned speech ended
        self.seconds_done = 0.0
        self._ids = (f"whisper-{uuid.uuid4().hex[:8]}-{i}" for i in itertools.count())
        # every request's arrival for the engine: a window's fallback or next window waits behind
        # the jobs that came before this one, not behind every window queued meanwhile
        self.arrival_time = time.monotonic()

    def start(self) -> list[WindowRequest]:
        """A request for every window with sound (seek windows: for the first window of each
        input); silent windows count as done at once. An input whose language is
        to be detected gets a detection request first (`_detection_request`), and its windows'
        requests come when that finishes."""
        voiced = [w for w in self.windows if not is_silent(self._audio(w))]
        decoded = {id(w) for w in voiced}
        for window in self.windows:
            window.done = id(window) not in decoded
        self._progress(sum(w.duration for w in self.windows) - sum(w.duration for w in voiced))
        if self.seek:  # a clip goes on after its silent first window
            later = (self._seek_window(w, w.end) for w in list(self.windows) if w.done)
            voiced = sorted([*voiced, *filter(None, later)], key=lambda w: (w.input_index, w.start))
        requests = []
        for index in range(len(self.audios)):
            self._report(index)
            self.queued[index] = [w for w in voiced if w.input_index == index]
            if not self.seek:
                # as in openai-whisper, the initial prompt reaches only each input's first window
                # (every window with `carry_initial_prompt`)
                for window in self.queued[index][1:]:
                    window.context = self._reset_context()
            detect = self.languages[index] is None
            requests += [self._detection_request(index)] if detect else self._release(index)
        return requests

    def _detection_request(self, index: int) -> WindowRequest:
        """The request that detects an input's language, as faster-whisper detects it: from the
        logits after <|startoftranscript|> alone on the input's first 30 s (from its first
        clip's start). It returns its cross cache when the input's first window to decode has
        the same frames."""
        start = self.clips[index][0][0] if self.clips[index] else 0
        window = Window(index, start, min(start + N_SAMPLES, len(self.audios[index])), WindowState())
        prompt = {"encoder_prompt": self._encoder_prompt(window), "decoder_prompt": [self.tokens.sot]}
        detect = ControlProcessor(self.tokens, [DETECT], self.rules, window.state)
        params = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY,
                                logits_processors=[detect])
        queue = self.queued[index]
        reuse = "always" if queue and self._frames(queue[0]) == self._frames(window) else "never"
        request = WindowRequest(next(self._ids), prompt, params, window, 1, reuse, detects=True)
        return request

    def _release(self, index: int) -> list[WindowRequest]:
        """The requests of an input's windows once its language is known: all of them, or for
        seek windows the first one (`_next` makes the others in turn)."""
        queue = self.queued[index]
        if not self.seek:
            self.queued[index] = []
            return [self._request(window) for window in queue]
        return [self._request(queue.pop(0))] if queue else []

    def _windows_of(self, index: int) -> list[Window]:
        """An input's windows in time order."""
        return sorted((w for w in self.windows if w.input_index == index), key=lambda w: w.start)

    def finish(self, request: WindowRequest, output: RequestOutput) -> list[WindowRequest]:
        """Take a window's decode; returns its next request: the same window at the next
        temperature, or a follow-up for the rest of its audio (or nothing)."""
        window = request.window
        if request.detects:
            return self._detected(window, output)
        if window.cross_kv is None:
            window.cross_kv = output.cross_kv
        window.decodes.append(self._best_decode(request, output))
        failed = self._needs_fallback(window.decodes[-1], window.state.no_speech_prob)
        if failed and len(window.decodes) < len(self.options.temperature):
            return [self._request(window)]
        # all failed: the best of them, with the last temperature (faster-whisper's: above
        # prompt_reset_on_temperature its text stays out of the next prompt, as openai-whisper's
        # last decode does)
        decode = (dataclasses.replace(self._best_failed(window.decodes), temperature=window.decodes[-1].temperature)
                  if failed else window.decodes[-1])
        follow_up = self._settle(window, decode)
        if self.options.word_timestamps and window.segments:
            self.unaligned.append((window, decode))  # done once `align` gave it words
            if window.resume is not None:
                window.decodes = []
                return []  # `align` starts the input's next window, after its words
        else:
            window.done = True
            window.cross_kv = None
            self._report(window.input_index)
        window.decodes = []
        return self._next(window, follow_up)

    def _detected(self, detection: Window, output: RequestOutput) -> list[WindowRequest]:
        """An input's language is known: its first window to decode takes the detection's cross
        cache if it came back (the same frames), and the input's windows' requests go out."""
        index = detection.input_index
        self.languages[index] = detection.state.language
        self.language_probabilities[index] = detection.state.language_probability
        if self.on_language is not None:
            self.on_language(index, detection.state.language)
        if output.cross_kv is not None:
            self.queued[index][0].cross_kv = output.cross_kv
        return self._release(index)

    def alignment_batch(self) -> tuple[list[tuple[Window, Decode, list[int], list[int]]], list[list[int]], list[Any]]:
        """The windows decoded since the last call, each with its alignment prompt and the text
        tokens it aligns, and the token ids and cross keys and values of their alignment pass:
        the arguments of `aligner(token ids, cross_kvs)`, the model's teacher-forced pass
        (`alignment_pass`), one batch. Its results go to `align`."""
        batch = [(window, decode, self._alignment_prefix(window),
                  [t for seg in window.segments for t in seg.tokens if t < self.tokens.eot])
                 for window, decode in self.unaligned]
        self.unaligned = []
        return (batch, [prefix + ids + [self.tokens.eot] for _, _, prefix, ids in batch],
                [window.cross_kv for window, *_ in batch])

    def align(self, batch: list[tuple[Window, Decode, list[int], list[int]]],
              results: list[tuple[Any, Any]]) -> list[WindowRequest]:
        """Give the windows of an `alignment_batch` their words from the pass's `results`.
        Returns the requests of the seek windows that come next (see `_seek_after_words`)."""
        requests = []
        for (window, decode, prefix, ids), (scores, logits) in zip(batch, results):
            rows = slice(len(prefix) - 1, len(prefix) + len(ids))  # predicting text, then <|endoftext|>
            first, last = self._frames(window)
            frames = max(1, (last - first) // 2)  # encoder positions of its log-mel frames, as openai-whisper
            weights = scores[:, :, :frames].softmax(dim=-1).numpy()  # every row of the pass, as openai-whisper
            # over the text tokens only, as openai-whisper: not timestamps (likely at a segment's start)
            probs = logits[rows][:-1, :self.tokens.eot].softmax(dim=-1)[range(len(ids)), ids].numpy()
            aligned = align_words(self.tokenizer, ids, weights, rows.start, probs, frames,
                                  self.languages[window.input_index])
            index = window.input_index
            punctuations = (self.options.prepend_punctuations, self.options.append_punctuations)
            if window.resume is None:  # windows decoded at once: the speech before it may be pending
                last_speech = max(self.last_speech[index], window.offset)
                self.last_speech[index] = words_into_segments(aligned, window.segments, self.tokens.eot,
                                                              window.offset, last_speech, punctuations)
                threshold = self.options.hallucination_silence_threshold
                cut = None if threshold is None else hallucination_index(
                    window.segments, threshold, last_speech, window.offset, window.duration)
                window.segments = window.segments[:cut]
                clear_empty_segments(window.segments)
                after = None
            else:
                words_into_segments(aligned, window.segments, self.tokens.eot, window.offset,
                                    self.last_speech[index], punctuations)
                after = self._seek_after_words(window, decode)
            window.done = True
            window.cross_kv = None
            self._report(index)
            if window.resume is not None:
                requests += self._next(window, after)
        return requests

    def _seek_after_words(self, window: Window, decode: Decode) -> Optional[Window]:
        """A seek window's next window once its words are known, as openai-whisper seeks with
        word timestamps: from its last word's end, unless its decode closed its last segment.
        With `hallucination_silence_threshold`, as there too: from the window's end when no more
        than the threshold is left of its 30 s after that word; past the silence before a first
        segment that looks like a hallucination, with none of its segments kept; from a
        hallucination between silences (`hallucination_index`), which goes with the segments
        after it (to the clip's end when less than the threshold of the input is left after
        it). Its kept segments then join the prompt context."""
        index, offset = window.input_index, window.offset
        threshold = self.options.hallucination_silence_threshold
        resume, last_end = window.resume, speech_end(window.segments)
        if last_end is not None and last_end > offset and not self._single_timestamp_ending(decode.sampled):
            resume = self._sample_at(last_end)
            if threshold is not None and offset + CHUNK_LENGTH - last_end <= threshold:
                resume = window.end
        if threshold is not None:
            first = next((segment for segment in window.segments if segment.words), None)
            if is_anomaly(first) and first.start - offset > threshold:
                window.segments = []
                return self._seek_to(window, window.start + self._sample_at(first.start - offset))
            cut = hallucination_index(window.segments, threshold, self.last_speech[index], offset, window.duration)
            if cut is not None:
                hallucination = window.segments[cut]
                resume = self._sample_at(max(offset + 1, hallucination.start))
                # the audio decoded: the speech alone after VAD (faster-whisper's content_duration)
                if len(self.audios[index]) / SAMPLE_RATE - hallucination.end < threshold:
                    resume = self._clip_end(window)
                window.segments = window.segments[:cut]
        end = speech_end(window.segments)
        self.last_speech[index] = self.last_speech[index] if end is None else end
        return self._finish_seek(window, decode.temperature, resume)

    def _finish_seek(self, window: Window, temperature: float, resume: int) -> Optional[Window]:
        """A seek window's segments are final: those of no length or no text are emptied
        (`clear_empty_segments`), the spans of the others join the prompt context (with
        `timestamps=False` its one segment holds them all); its successor starts at `resume`."""
        clear_empty_segments(window.segments)
        if self.options.timestamps:
            kept = [span for span, segment in zip(window.kept, window.segments) if segment.tokens]
        else:
            kept = window.kept if any(segment.tokens for segment in window.segments) else []
        self._extend_context(window.input_index, kept, temperature)
        return self._seek_to(window, resume)

    def _seek_to(self, window: Window, start: int) -> Optional[Window]:
        """The next seek window from `start` (samples), the progress up to it counted."""
        self._progress((start - window.start) / SAMPLE_RATE)
        return self._seek_window(window, start)

    @staticmethod
    def _sample_at(seconds: float) -> int:
        """`seconds` in samples, on a 10 ms frame (openai-whisper seeks in frames)."""
        return round(seconds * SAMPLE_RATE / HOP_LENGTH) * HOP_LENGTH

    def _alignment_prefix(self, window: Window) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] <|notimestamps|>: the alignment pass's prompt."""
        language = self.languages[window.input_index] if self.tokens.multilingual else None
        return self.tokens.decoder_prefix(language, self.options.task, timestamps=False)

    def _settle(self, window: Window, decode: Decode) -> Optional[Window]:
        """Keep the accepted decode's segments; returns the follow-up window, if any."""
        no_speech = window.state.no_speech_prob
        o = self.options
        if is_no_speech(no_speech, decode.avg_logprob, o.no_speech_threshold, o.logprob_threshold):
            self._progress(window.duration)
            return self._seek_window(window, window.end) if self.seek else None
        spans = split_spans(decode.sampled, self.tokens)
        if self.seek and self.decode_timestamps and not spans:  # no text: one segment, emptied, as openai-whisper's
            spans = [(self._last_timestamp(decode.sampled), None, [])]
        texts = [decode_text(self.tokenizer, ids, self.tokens) for _, _, ids in spans]
        if self.seek:
            plan = plan_seek(spans, texts, self.decode_timestamps,
                             self._single_timestamp_ending(decode.sampled), o.compression_ratio_threshold)
        else:
            plan = plan_window(spans, texts, window.duration, self.decode_timestamps,
                               self._last_timestamp(decode.sampled), o.compression_ratio_threshold)
        if window.previous_text and plan.kept:
            plan.kept[0] = self._without_repeats(window.previous_text, plan.kept[0])
            plan.kept = [span for span in plan.kept if span[2]]
        spans = plan.kept
        if not self.options.timestamps:  # the window is one segment, its kept text, within the window
            end_time = None if plan.resume is None else min(plan.resume, window.duration)
            spans = [(0.0, end_time, [t for _, _, ids in plan.kept for t in ids])]
        start, end = self._frames(window)
        # an open segment ends at the window's last frame, as in openai-whisper; times past the
        # window's end stay where nothing follows in its clip (as there), else stop at the next window
        ends_clip = window.end == self._clip_end(window)
        window.segments = window_segments(
            spans, self.tokens, self.tokenizer, window.offset, (end - start) * HOP_LENGTH / SAMPLE_RATE,
            None if ends_clip else window.duration, self.options.timestamps, plan.from_start,
            avg_logprob=decode.avg_logprob, no_speech_prob=no_speech, temperature=decode.temperature,
            compression_ratio=decode.compression_ratio, seek=round(window.offset * 100))
        if self.seek:
            resume = window.end if plan.resume is None else window.start + round(plan.resume * SAMPLE_RATE)
            window.kept = plan.kept
            if self.options.word_timestamps and window.segments:
                window.resume = resume  # the words may move it (`_seek_after_words`)
                return None
            return self._finish_seek(window, decode.temperature, resume)
        if not self.options.word_timestamps:
            clear_empty_segments(window.segments)
        if plan.resume is None or window.follow_ups >= MAX_FOLLOW_UPS:
            self._progress(window.duration)
            return None
        cut = window.start + round(plan.resume * SAMPLE_RATE)
        self._progress((cut - window.start) / SAMPLE_RATE)
        follow_up = Window(window.input_index, cut, window.end,
                           WindowState(), window.follow_ups + 1,
                           "".join(s.text for s in window.segments),
                           self._reset_context())
        self.windows.append(follow_up)
        if is_silent(self._audio(follow_up)):
            follow_up.done = True
            self._progress(follow_up.duration)
            return None
        return follow_up

    def _seek_window(self, window: Window, start: int) -> Optional[Window]:
        """Seek windows: the next window of `window`'s clip, from `start` (in samples) for 30 s
        or to the clip's end, with its language; silent ones on the way count as done. None at
        the clip's end."""
        clip_end = self._clip_end(window)
        while True:
            after = Window(window.input_index, start, min(start + N_SAMPLES, clip_end), WindowState())
            first, last = self._frames(after)
            if first >= last:
                self._progress(after.duration)
                return None
            self.windows.append(after)
            if not is_silent(self._audio(after)):
                return after
            after.done = True
            self._progress(after.duration)
            start = after.end

    def _next(self, window: Window, follow_up: Optional[Window]) -> list[WindowRequest]:
        """The follow-up's request, or for seek windows, the input's next window's."""
        if follow_up is not None:
            return [self._request(follow_up)]
        queue = self.queued[window.input_index]
        return [self._request(queue.pop(0))] if queue else []

    def _extend_context(self, index: int, kept: list[Span], temperature: float) -> None:
        """Seek windows: the kept segments, with their timestamps, join the input's context;
        not conditioned on previous text, or after a decode sampled hotter than
        `prompt_reset_on_temperature`, it is reset instead (`_reset_context`)."""
        if not self.options.condition_on_previous_text or temperature > self.options.prompt_reset_on_temperature:
            self.context[index] = self._reset_context()
            return
        for span in kept:
            self.context[index] += span_tokens(span, self.tokens)

    def _reset_context(self) -> list[int]:
        """A context after a reset: the initial prompt if it is carried, else nothing."""
        return list(self.initial) if self.options.carry_initial_prompt else []

    def _without_repeats(self, previous: str, span: Span) -> Span:
        """`span` less its leading tokens whose words repeat the end of `previous`."""
        start, end, ids = span
        repeated = repeated_words(previous, decode_text(self.tokenizer, ids, self.tokens))
        if not repeated:
            return span
        text = [decode_text(self.tokenizer, [t], self.tokens) for t in ids]
        cut = next(i for i in range(len(ids) + 1)
                   if len(words("".join(text[:i]))) >= repeated and (i == len(ids) or text[i].startswith(" ")))
        return start, end, ids[cut:]

    def _best_decode(self, request: WindowRequest, output: RequestOutput) -> Decode:
        """The likeliest of a request's completions, as openai-whisper's ranker picks it: by
        the sum of log-probabilities over the tokens before <|endoftext|>, divided by their
        number or by ((5 + number) / 6) ** length_penalty (its `avg_logprob` divides by one
        more)."""
        ranked = []
        length_penalty = self.options.length_penalty
        for completion in output.outputs:
            sampled = completion.token_ids[request.num_forced:]
            num_text = len(sampled) - (1 if sampled and sampled[-1] == self.tokens.eot else 0)
            logprob = completion.cumulative_logprob
            decode = Decode(sampled, decode_text(self.tokenizer, sampled, self.tokens),
                            logprob / (num_text + 1), request.params.temperature)
            penalty = max(num_text, 1) if length_penalty is None else ((5 + num_text) / 6) ** length_penalty
            ranked.append((logprob / penalty, decode))
        return max(ranked, key=lambda pair: pair[0])[1]

    def _needs_fallback(self, decode: Decode, no_speech_prob: float) -> bool:
        o = self.options
        unsure = o.logprob_threshold is not None and decode.avg_logprob < o.logprob_threshold
        if unsure and o.no_speech_threshold is not None and no_speech_prob > o.no_speech_threshold:
            return False  # silence: the no-speech rule decides
        return unsure or (o.compression_ratio_threshold is not None
                          and decode.compression_ratio > o.compression_ratio_threshold)

    def return_cross_kv(self, request: WindowRequest) -> Union[bool, Callable[[RequestOutput], bool]]:
        """`LLMEngine.add_request`'s `return_cross_kv` for `request`. The test of a window that
        may fall back is made for the engine alone: kept on the request, it would tie the job
        into a reference cycle, and its audio features would wait for the garbage collector."""
        if request.return_cross_kv == "if it fails":
            return functools.partial(self._fails, request)
        return request.return_cross_kv == "always"

    def _fails(self, request: WindowRequest, output: RequestOutput) -> bool:
        """Whether `output` is a decode `finish` will try again at the next temperature."""
        return self._needs_fallback(self._best_decode(request, output), request.window.state.no_speech_prob)

    def _best_failed(self, decodes: list[Decode]) -> Decode:
        """When every temperature failed: the likeliest decode that is not too repetitive
        (faster-whisper's choice), else the likeliest."""
        limit = self.options.compression_ratio_threshold
        fluent = [d for d in decodes if limit is None or d.compression_ratio <= limit]
        return max(fluent or decodes, key=lambda d: d.avg_logprob)

    def results(self, sources: list[Any]) -> list[Transcription]:
        """One `Transcription` per input, its windows' segments in time order."""
        return [self._transcription(index, source) for index, source in enumerate(sources)]

    def _request(self, window: Window) -> WindowRequest:
        prefix = control_prefix(self.tokens, self.languages[window.input_index], self.options.task,
                                self.decode_timestamps)
        context = self.context[window.input_index] if window.context is None else window.context
        decoder_prompt = self._decoder_prompt(context)
        prompt = {"encoder_prompt": self._encoder_prompt(window), "decoder_prompt": decoder_prompt}
        params = SamplingParams(max_tokens=self._max_tokens(decoder_prompt, len(prefix)) + len(prefix),
                                output_kind=RequestOutputKind.FINAL_ONLY,
                                logits_processors=[*self.penalties,
                                                   ControlProcessor(self.tokens, prefix, self.rules, window.state)],
                                **self._decoding(window))
        request = WindowRequest(next(self._ids), prompt, params, window, len(prefix))
        if window.cross_kv is None and self.options.word_timestamps:
            request.return_cross_kv = "always"
        elif window.cross_kv is None and len(window.decodes) + 1 < len(self.options.temperature):
            request.return_cross_kv = "if it fails"
        return request

    def _encoder_prompt(self, window: Window) -> dict:
        """The window's cross cache when it has one, else its frames of its input's log-mel."""
        if window.cross_kv is not None:
            return {"cross_kv": window.cross_kv}
        start, end = self._frames(window)
        features = self.features[window.input_index][:, start:end]
        return {"prompt": "", "multi_modal_data": {"audio_features": features}}

    def _decoder_prompt(self, context: list[int]) -> list[int]:
        return decoder_prompt(self.tokens, context, self.initial if self.options.carry_initial_prompt else [],
                              self.hotwords)

    def _decoding(self, window: Window) -> dict:
        """Greedy or beam search at temperature 0; `best_of` seeded samples above it."""
        o = self.options
        temperature = o.temperature[len(window.decodes)]
        if temperature > 0.0:
            seed = None if o.seed is None else decode_seed(o.seed, window.start, len(window.decodes))
            return dict(temperature=temperature, n=o.best_of, seed=seed, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p)
        if o.beam_size and (o.beam_size > 1 or o.patience):  # every kept hypothesis, ranked by `_best_decode`
            return dict(temperature=0.0, use_beam_search=True, beam_width=o.beam_size,
                        beam_rules="whisper", patience=o.patience,
                        n=max_candidates(o.beam_size, o.patience))
        return dict(temperature=0.0)

    def _max_tokens(self, decoder_prompt: list[int], num_control: int = MAX_CONTROL_TOKENS) -> int:
        """Tokens a window may sample after its `num_control` control tokens: `max_new_tokens`,
        else openai-whisper's n_text_ctx // 2, and no more than the decoder has room for (the
        last one takes no position, as openai-whisper never feeds it back)."""
        return min(self.options.max_new_tokens or SAMPLE_LEN, decoder_room(self.max_decoder_len, len(decoder_prompt)) - num_control)

    def _audio(self, window: Window) -> np.ndarray:
        return self.audios[window.input_index][window.start:window.end]

    def _clip_end(self, window: Window) -> int:
        """The end (in samples) of the clip `window` lies in."""
        return next(end for begin, end in self.clips[window.input_index] if begin <= window.start < end)

    def _frames(self, window: Window) -> tuple[int, int]:
        """The window's log-mel frames `[start, end)` in its input's features (at most 3000)."""
        start = round(window.start / HOP_LENGTH)
        end = min(self.features[window.input_index].shape[-1], round(window.end / HOP_LENGTH), start + N_FRAMES)
        return start, max(start, end)

    def _single_timestamp_ending(self, sampled: list[int]) -> bool:
        """Whether the text before <|endoftext|> ends in a lone timestamp (closing its segment)."""
        begin = self.tokens.timestamp_begin
        text = sampled[:sampled.index(self.tokens.eot)] if self.tokens.eot in sampled else sampled
        return begin is not None and len(text) >= 2 and text[-1] >= begin and text[-2] < begin

    def _last_timestamp(self, sampled: list[int]) -> Optional[float]:
        begin = self.tokens.timestamp_begin
        stamps = [t for t in sampled if begin is not None and t >= begin]
        return (stamps[-1] - begin) * TIME_PRECISION if stamps else None

    def _report(self, index: int) -> None:
        """Hand `on_segments` the input's next decoded windows, up to the first one pending."""
        if self.on_segments is None:
            return
        first_id = 0
        for window in self._windows_of(index):
            if not window.done:
                return
            if not window.reported:
                window.reported = True
                if window.segments:
                    self.on_segments(index, self._in_input_time(index, window.segments, first_id))
            first_id += len(window.segments)

    def _in_input_time(self, index: int, segments: list[Segment], first_id: int = 0) -> list[Segment]:
        """The segments numbered from `first_id`, and with VAD, their times in the joined speech
        -> times in the input."""
        speech = self.speech_maps[index]
        return [dataclasses.replace(seg if speech is None else speech.segment_to_original(seg), id=first_id + i)
                for i, seg in enumerate(segments)]

    def _progress(self, seconds: float) -> None:
        self.seconds_done += seconds
        if self.on_progress is not None and seconds > 0:
            self.on_progress(self.seconds_done)

    def _transcription(self, index: int, source: Any) -> Transcription:
        """Merge one input's windows."""
        segments = self._in_input_time(index, [seg for w in self._windows_of(index) for seg in w.segments])
        return Transcription(text="".join(s.text for s in segments).strip(), language=self.languages[index],
                             language_probability=self.language_probabilities[index],
                             segments=segments, duration=self.durations[index],
                             source=source if isinstance(source, str) else None)


def decode_seed(seed: int, start: int, attempt: int) -> int:
    """The seed of the `attempt`-th decode of the window at sample `start`: mixed from the
    three, so that no two windows or fallbacks of an input share a random stream (the engine
    draws sample i of the request from this seed + i); the same window of another input draws
    the same, so that a transcript does not depend on what else is in the batch."""
    return int(np.random.SeedSequence([seed, start, attempt]).generate_state(1, np.uint64)[0]) >> 1


def _clips(audio: np.ndarray, clips: list[float]) -> list[tuple[int, int]]:
    """The sample ranges of the clips `[start, end, start, end, ...]` (seconds) of `audio`, each
    time on its 10 ms frame (as openai-whisper's seek points)."""
    bounds = [min(len(audio), round(t * SAMPLE_RATE / HOP_LENGTH) * HOP_LENGTH) for t in clips] or [0]
    if len(bounds) % 2:
        bounds.append(len(audio))
    return [(start, end) for start, end in zip(bounds[::2], bounds[1::2]) if end > start]
