"""Request and response bodies: OpenAI's names and shapes, plus encdec's `/v1/summarize`.

Requests forbid unknown fields, so a misspelt option is a 400 naming it, not silently ignored.
"""
from __future__ import annotations

import json
import re
import time
import typing
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationInfo,
                      field_validator, model_serializer, model_validator)


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def unicode_text(cls, value: Any) -> Any:
        """Text must be Unicode that encodes: JSON's lone surrogates ("\\ud800") are refused."""
        for text in texts(value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"the text holds a lone surrogate, \\u{ord(text[err.start]):04x} at "
                                 f"position {err.start}, which is not valid Unicode") from None
        return value


class JSONRequest(OpenAIBaseModel):
    """A JSON body: each value of its field's JSON type (no "yes" for true, no true for 1);
    null for a field means its default, as OpenAI's nullable fields do."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        names = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        return {key: value for key, value in data.items() if value is not None or key not in names}


def texts(value: Any) -> list[str]:
    """Every string in a JSON value (dictionary keys too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for key, item in value.items() for t in texts(key) + texts(item)]
    if isinstance(value, list):
        return [t for item in value for t in texts(item)]
    return []


def unix_time() -> int:
    return int(time.time())


# ----------------------------------------------------------------------------- shared


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StreamOptions(JSONRequest):
    """`include_usage`: a last chunk with the usage; vLLM's `continuous_usage_stats`: on every
    chunk too, the usage of its prompt and its choice so far. OpenAI's `include_obfuscation` is
    taken and has nothing to do here (no padding is added to the chunks)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool = True


# ----------------------------------------------------------------------------- completions


MAX_LOGPROBS = 20  # vLLM's default --max-logprobs: alternatives per generated or scored token
# Stop strings and bad words a request may send (OpenAI takes 4 stop strings, vLLM any number):
# each one is looked for at every step, and 5000 made a request ten times slower.
MAX_STRINGS = 64
MAX_ALLOWED_TOKEN_IDS = 2**18  # more than any vocabulary encdec serves (mBART-50's: 250054)


class CompletionRequest(JSONRequest):
    """OpenAI's `CreateCompletionRequest`; `prompt` goes to the encoder. encdec's extras:
    `decoder_prompt`, and `source_lang` / `target_lang`, which make text prompts translations
    as `encdec translate` makes them. Extras as in vLLM: `top_k`, `min_p`, `min_tokens`,
    `repetition_penalty`, `stop_token_ids`, `bad_words`, `allowed_token_ids`, `include_stop_str_in_output`, `ignore_eos`,
    `skip_special_tokens`, `truncate_prompt_tokens`, `prompt_logprobs` (of the decoder prompt),
    `return_tokens_as_token_ids`, `use_beam_search` (unset: the checkpoint's `num_beams` decides)
    and `length_penalty` (of a beam search)."""

    model: str
    prompt: Union[list[int], list[list[int]], str, list[str]]
    decoder_prompt: Optional[Union[str, list[int]]] = None
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128)
    best_of: Optional[int] = Field(None, ge=1, le=20)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    logit_bias: Optional[dict[str, float]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    echo: bool = False
    suffix: Optional[str] = None
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: Optional[str] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    min_tokens: Optional[int] = Field(None, ge=0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0)
    stop_token_ids: list[int] = Field(default_factory=list)
    bad_words: list[str] = Field(default_factory=list)
    allowed_token_ids: Optional[list[int]] = Field(None, max_length=MAX_ALLOWED_TOKEN_IDS)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    return_tokens_as_token_ids: bool = False
    use_beam_search: Optional[bool] = None
    length_penalty: Optional[float] = None

    @field_validator("stop", "bad_words")
    @classmethod
    def few_strings(cls, value: Union[str, list[str], None]) -> Union[str, list[str], None]:
        if isinstance(value, list) and len(value) > MAX_STRINGS:
            raise ValueError(f"at most {MAX_STRINGS} strings, got {len(value)}")
        return value


class CompletionLogProbs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's `Logprob` in JSON."""

    logprob: float
    rank: int
    decoded_token: Optional[str] = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None  # vLLM's: the stop string or stop token id that ended it
    prompt_logprobs: Optional[list[Optional[dict[int, PromptLogprob]]]] = None  # vLLM's, when asked for

    @model_serializer(mode="wrap")
    def _with_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """OpenAI's fields and vLLM's `stop_reason`, null ones too (OpenAI's schema requires
        them all), and vLLM's `prompt_logprobs` when asked for."""
        data = handler(self)
        shown = {name: data.get(name) for name in ("index", "text", "logprobs", "finish_reason", "stop_reason")}
        if self.prompt_logprobs is not None:
            shown["prompt_logprobs"] = data["prompt_logprobs"]
        return shown


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=unix_time)
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


# ----------------------------------------------------------------------------- summarize


class SummarizeRequest(JSONRequest):
    """Unset decoding fields take the checkpoint's generation config."""

    model: str
    input: Union[str, list[str]]
    max_tokens: Optional[int] = Field(None, ge=1)
    min_tokens: Optional[int] = Field(None, ge=0)
    num_beams: Optional[int] = Field(None, ge=1)
    length_penalty: Optional[float] = None
    no_repeat_ngram_size: Optional[int] = Field(None, ge=0)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_k: Optional[int] = Field(None, ge=-1)  # vLLM's: -1 or 0 for all
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    seed: Optional[int] = None
    truncate: bool = True
    stream: bool = False


class Summary(BaseModel):
    index: int
    text: str
    finish_reason: Optional[str] = None
    input_tokens: Optional[int] = None
    truncated_tokens: Optional[int] = None


class SummarizeResponse(BaseModel):
    id: str
    object: Literal["summary", "summary.chunk"] = "summary"
    created: int = Field(default_factory=unix_time)
    model: str
    summaries: list[Summary]
    usage: Optional[UsageInfo] = None


# ----------------------------------------------------------------------------- audio

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class FormRequest(OpenAIBaseModel):
    """Form fields: text, read as each field's type; an integer field takes a whole number only
    ("2.0" is refused, where pydantic's lax mode would take it as 2)."""

    @field_validator("*", mode="before")
    @classmethod
    def whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if (isinstance(value, str) and int in (annotation, *typing.get_args(annotation))
                and not re.fullmatch(r"\s*[+-]?\d+\s*", value)):
            raise ValueError(f"expected an integer, got {value!r}")
        return value


class TranslationRequest(FormRequest):
    """The form fields of `/v1/audio/translations` besides `file`. Extras: openai-whisper's
    decoding options by their CLI names (`encdec.entrypoints.whisper_options`); unset, they
    keep `TranscribeOptions`' defaults (greedy, fallback on). As in vLLM, `language` (the
    speech's, not detected then) and `stream` hold for translations too, and vLLM's sampling
    fields: `seed`, `top_k`, `top_p` and `min_p` for the sampled decodes (a fallback's, or all
    above temperature 0), `repetition_penalty` (faster-whisper's), `presence_penalty` and
    `frequency_penalty` over what each decode makes, not its prompt, and `max_completion_tokens`
    (each window's at most: `max_new_tokens`)."""

    model: str
    language: Optional[str] = None
    stream: bool = False
    prompt: Optional[str] = None
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    temperature_increment_on_fallback: Optional[float] = Field(None, ge=0.0, le=1.0)
    beam_size: Optional[int] = Field(None, ge=1, le=20)
    best_of: Optional[int] = Field(None, ge=1, le=20)
    patience: Optional[float] = Field(None, gt=0.0)
    compression_ratio_threshold: Optional[float] = None
    logprob_threshold: Optional[float] = None
    no_speech_threshold: Optional[float] = Field(None, ge=0.0, le=1.0)
    condition_on_previous_text: Optional[bool] = None
    windows_at_once: Optional[bool] = None
    hotwords: Optional[str] = None
    vad_filter: Optional[bool] = None
    repetition_penalty: Optional[float] = Field(None, gt=0.0)
    no_repeat_ngram_size: Optional[int] = Field(None, ge=0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    top_k: Optional[int] = None
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    seed: Optional[int] = None
    max_completion_tokens: Optional[int] = Field(None, ge=1)


class ServerVad(FormRequest):
    """OpenAI's `chunking_strategy` of type `server_vad`: encdec's VAD filter, its silence and
    padding in milliseconds; unset fields take OpenAI's defaults."""

    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    silence_duration_ms: int = Field(200, ge=0)
    prefix_padding_ms: int = Field(300, ge=0)


class TranscriptionRequest(TranslationRequest):
    """The form fields of `/v1/audio/transcriptions` besides `file`. `chunking_strategy`
    "auto" is how audio is cut anyway (30 s windows); `server_vad` turns the VAD filter on."""

    model_config = ConfigDict(populate_by_name=True)

    timestamp_granularities: list[Literal["word", "segment"]] = Field(
        default_factory=lambda: ["segment"], alias="timestamp_granularities[]")
    chunking_strategy: Optional[Union[Literal["auto"], ServerVad]] = None
    include: list[Literal["logprobs"]] = Field(default_factory=list, alias="include[]")
    hallucination_silence_threshold: Optional[float] = Field(None, gt=0.0)  # needs word timings

    @field_validator("timestamp_granularities", mode="before")
    @classmethod
    def one_granularity(cls, value: Any) -> Any:
        """A hand-written form's `timestamp_granularities=word` (no brackets): a list of one."""
        return [value] if isinstance(value, str) else value

    @field_validator("chunking_strategy", mode="before")
    @classmethod
    def auto_or_object(cls, value: Any) -> Any:
        """A hand-written form's `chunking_strategy={"type": "server_vad", ...}`: the object
        (the official client sends one field per key, `chunking_strategy[type]`); a value that
        is neither "auto" nor an object is refused in words, not by the union's member names."""
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                return json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"not a JSON object: {err}") from None
        if value is not None and value != "auto" and not isinstance(value, (dict, ServerVad)):
            raise ValueError(f'expected "auto" or a server_vad object ({{"type": "server_vad", ...}}), '
                             f"got {value!r}")
        return value


class TranscriptionSegment(BaseModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionWord(BaseModel):
    word: str
    start: float
    end: float


class TranscriptionUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionVerbose(BaseModel):
    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: Optional[list[TranscriptionSegment]] = None  # with timestamp_granularities[]=segment
    words: Optional[list[TranscriptionWord]] = None  # with timestamp_granularities[]=word
    usage: Optional[TranscriptionUsage] = None  # a transcription's (none for a translation)


class TranscriptionDelta(BaseModel):
    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TranscriptionDone(BaseModel):
    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: Optional[TranscriptionUsage] = None  # a transcription's (none for a translation)


# ----------------------------------------------------------------------------- models


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "encdec"
    root: str  # the checkpoint it serves
    parent: Optional[str] = None
    max_model_len: int  # vLLM's: the decoder's positions (a prompt's limit is the encoder's)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
