"""Sampling parameters of one request, validated at the edge."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from encdec.checks import flag, is_number

# (output token ids so far, logits row [vocab]) -> logits row; may modify in place.
LogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]

_GREEDY_EPS = 1e-5

# What an unset field becomes when the checkpoint's generation config does not decide it.
BUILTIN_DEFAULTS = dict(
    max_tokens=16, min_tokens=0, temperature=1.0, top_k=-1, top_p=1.0, use_beam_search=False,
    beam_width=1, length_penalty=1.0, early_stopping=False, no_repeat_ngram_size=0,
    repetition_penalty=1.0, forced_bos_token_id=None, forced_eos_token_id=None,
    bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
)
EARLY_STOPPING_VALUES = (True, False, "never")
BEAM_RULES = ("hf", "whisper")
INTEGER_FIELDS = ("n", "max_tokens", "min_tokens", "top_k", "seed", "logprobs", "beam_width",
                  "no_repeat_ngram_size", "forced_bos_token_id", "forced_eos_token_id")
NUMBER_FIELDS = ("temperature", "top_p", "length_penalty", "patience", "repetition_penalty")
FLAG_FIELDS = ("ignore_eos", "skip_special_tokens", "use_beam_search", "config_per_field",
               "include_stop_str_in_output")


class RequestOutputKind(enum.Enum):
    """What each output of a request holds (vLLM's names)."""

    CUMULATIVE = 0  # everything generated so far, at every step
    DELTA = 1  # only what is new since the request's previous output
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    """How to decode one request: vLLM's names and meanings, plus Hugging Face's beam search.

    Fields left as None are unset. The engine fills them per request from the checkpoint's
    generation config when `temperature` is unset (see `encdec.generation_config`), otherwise
    from `BUILTIN_DEFAULTS`; setting `temperature` asks for plain vLLM-style decoding. With
    `config_per_field` (what the server and `encdec summarize` send) the config fills each unset
    field whether `temperature` is set or not, as vLLM's server and Hugging Face's `generate()`
    do; a set `temperature` then only decides whether to sample (above 0: without the config's
    beams).

    `stop` strings end a completion where one appears in its text, after `min_tokens` (see
    `encdec.engine.stop_strings`; a beam search's hypotheses are cut after the search).
    temperature 0 means greedy. `seed` gives the request its own generator, so its samples do
    not depend on what else is in the batch. `logprobs` asks for that many top log-probabilities
    per generated token (plus the chosen one). `logits_processors` run per sequence, in order,
    after the built-in ones (repetition_penalty, no_repeat_ngram_size, min_tokens,
    forced_bos_token_id, forced_eos_token_id).

    Beam search (`use_beam_search`, or just `beam_width` >= 2) keeps `beam_width` beams and
    returns the best `n` finished hypotheses, scored `sum of log-probs / generated_len **
    length_penalty`; `early_stopping` is True, False or "never" with Hugging Face's meanings.
    `patience` (openai-whisper's): with `early_stopping=True` the search ends once
    `round(beam_width * patience)` hypotheses have finished (1.0: `beam_width` of them).
    `beam_rules="whisper"` follows openai-whisper's `BeamSearchDecoder` instead (see
    `encdec.sampling.beam_search`): `length_penalty` and `early_stopping` do not apply, and `n`
    may be up to `round(beam_width * patience)`, every hypothesis it keeps.
    `forced_bos_token_id` is forced as the first generated token (the default decoder prompt is
    then just <DEC>), `forced_eos_token_id` as the last one allowed by `max_tokens`. As in
    Hugging Face's generation config: `bad_words_ids` (token sequences that are never completed;
    EOS alone is never banned), `suppress_tokens` (never sampled) and `begin_suppress_tokens` (not
    sampled first; after a forced BOS: not second).

    `output_kind` says what `LLMEngine.step()` returns for the request as it runs (streaming);
    beam search gives one output, when it finishes, whatever the kind.
    """

    n: int = 1
    max_tokens: Optional[int] = None
    min_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    logits_processors: list[LogitsProcessor] = field(default_factory=list)
    use_beam_search: Optional[bool] = None
    beam_width: Optional[int] = None
    length_penalty: Optional[float] = None
    early_stopping: Union[bool, str, None] = None
    patience: Optional[float] = None
    beam_rules: str = "hf"
    no_repeat_ngram_size: Optional[int] = None
    repetition_penalty: Optional[float] = None
    forced_bos_token_id: Optional[int] = None
    forced_eos_token_id: Optional[int] = None
    bad_words_ids: Optional[list[list[int]]] = None
    suppress_tokens: Optional[list[int]] = None
    begin_suppress_tokens: Optional[list[int]] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    config_per_field: bool = False

    def __post_init__(self) -> None:
        self._normalize_types()
        self._validate()

    def _normalize_types(self) -> None:
        """Python ints, floats and bools from their NumPy kin; a wrong type names its field."""
        for name in INTEGER_FIELDS:
            setattr(self, name, _integer(name, getattr(self, name)))
        for name in NUMBER_FIELDS:
            value = getattr(self, name)
            if value is not None:
                _check(is_number(value), f"{name} must be a number, got {value!r}")
                setattr(self, name, float(value))
        for name in FLAG_FIELDS:
            value = getattr(self, name)
            if value is not None or name != "use_beam_search":
                setattr(self, name, flag(name, value))
        stop = self.stop_token_ids if self.stop_token_ids is not None else []
        self.stop_token_ids = _token_ids("stop_token_ids", stop)
        self.stop = _strings("stop", self.stop)
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, _token_ids(name, value))
        if self.bad_words_ids is not None:
            _check(_is_list(self.bad_words_ids) and all(_is_list(w) and len(w) for w in self.bad_words_ids),
                   f"bad_words_ids must be a list of non-empty lists of token ids, got {self.bad_words_ids!r}")
            self.bad_words_ids = [_token_ids("bad_words_ids", w) for w in self.bad_words_ids]

    def _validate(self) -> None:
        _check(self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _check(self.max_tokens is None or self.max_tokens >= 1,
               f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _check(self.min_tokens is None or self.min_tokens >= 0,
               f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens is None or self.min_tokens <= self.max_tokens,
               f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        _check(self.temperature is None or 0.0 <= self.temperature < math.inf,
               f"temperature must be a finite number >= 0, got {self.temperature}")
        _check(self.top_p is None or 0.0 < self.top_p <= 1.0,
               f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k is None or self.top_k == -1 or self.top_k >= 1,
               f"top_k must be -1 (disabled) or an integer >= 1, got {self.top_k!r}")
        _check(self.seed is None or -2**63 <= self.seed < 2**64,
               f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        _check(self.logprobs is None or self.logprobs >= 0,
               f"logprobs must be an integer >= 0, got {self.logprobs!r}")
        for name in ("stop_token_ids", "suppress_tokens", "begin_suppress_tokens"):
            ids = getattr(self, name) or []
            _check(all(t >= 0 for t in ids), f"{name} must be non-negative integers, got {ids!r}")
        _check(all(t >= 0 for w in self.bad_words_ids or [] for t in w),
               f"bad_words_ids must be non-negative integers, got {self.bad_words_ids!r}")
        _check(isinstance(self.output_kind, RequestOutputKind),
               f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        _check(isinstance(self.logits_processors, (list, tuple))
               and all(callable(p) for p in self.logits_processors),
               f"logits_processors must be a list of callables, got {self.logits_processors!r}")
        self._validate_processors()
        self._validate_beam_search()

    def _validate_processors(self) -> None:
        _check(self.no_repeat_ngram_size is None or self.no_repeat_ngram_size >= 0,
               f"no_repeat_ngram_size must be an integer >= 0, got {self.no_repeat_ngram_size!r}")
        _check(self.repetition_penalty is None or 0.0 < self.repetition_penalty < math.inf,
               f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("forced_bos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            _check(value is None or value >= 0,
                   f"{name} must be a non-negative token id, got {value!r}")

    def _validate_beam_search(self) -> None:
        _check(self.beam_width is None or self.beam_width >= 1,
               f"beam_width must be an integer >= 1, got {self.beam_width!r}")
        _check(self.length_penalty is None or math.isfinite(self.length_penalty),
               f"length_penalty must be a finite number, got {self.length_penalty!r}")
        _check(self.early_stopping is None or any(
            self.early_stopping is v or (isinstance(v, str) and self.early_stopping == v)
            for v in EARLY_STOPPING_VALUES),
            f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        _check(self.beam_rules in BEAM_RULES,
               f"beam_rules must be one of {list(BEAM_RULES)}, got {self.beam_rules!r}")
        if not self.is_beam_search:
            _check(self.use_beam_search is not False or self.beam_width in (None, 1),
                   f"beam_width={self.beam_width} needs use_beam_search=True")
            _check(self.patience is None, "patience needs beam search")
            return
        width = self.beam_width
        _check(width is None or width >= 2,
               f"beam search needs beam_width >= 2, got beam_width={width}")
        _check(self.temperature is None or self.temperature < _GREEDY_EPS,
               "temperature must be 0 (or unset): beam search is deterministic, "
               f"got {self.temperature}")
        _check(self.top_k in (None, -1) and self.top_p in (None, 1.0),
               f"top_k must be -1 and top_p 1: beam search does not sample, "
               f"got top_k={self.top_k}, top_p={self.top_p}")
        _check(self.logprobs is None, "logprobs is not supported with beam search")
        _check(self.patience is None or 0 < self.patience < math.inf,
               f"patience must be a finite number > 0, got {self.patience!r}")
        _check(width is None or max_candidates(width, self.patience) >= 1,
               f"patience={self.patience} with beam_width={width} waits for no finished beam: "
               f"round(beam_width * patience) must be >= 1")
        kept = width if width is None or self.beam_rules == "hf" else self.max_candidates
        _check(kept is None or self.n <= kept,
               f"n={self.n} must be <= {'beam_width' if kept == width else 'round(beam_width * patience)'}"
               f"={kept} (beam search returns the best n beams)")

    @property
    def is_beam_search(self) -> bool:
        """Whether the request asks for beam search (`use_beam_search`, or a `beam_width` > 1)."""
        if self.use_beam_search is not None:
            return self.use_beam_search
        return self.beam_width is not None and self.beam_width > 1

    @property
    def is_greedy(self) -> bool:
        return self.temperature is not None and self.temperature < _GREEDY_EPS

    def is_stop_token(self, token: int, eos_token_id: Optional[int]) -> bool:
        """Whether sampling `token` ends a sequence (once `min_tokens` are out)."""
        return token in self.stop_token_ids or (not self.ignore_eos and token == eos_token_id)

    def is_forced_end(self, num_generated: int, token: int) -> bool:
        """Whether `token`, the sequence's `num_generated`-th, is `forced_eos_token_id` forced
        at `max_tokens`: the length limit cut the sequence (finish_reason "length")."""
        return (token == self.forced_eos_token_id and self.max_tokens is not None
                and num_generated >= self.max_tokens)

    @property
    def max_candidates(self) -> int:
        """Finished hypotheses that end a beam search with `early_stopping=True`, and that
        openai-whisper's rules keep."""
        return max_candidates(self.beam_width, self.patience)

    @property
    def max_num_seqs(self) -> int:
        """Decoder sequences the request will run at once."""
        if self.is_beam_search and self.beam_width is not None:
            return self.beam_width
        return self.n


def max_candidates(beam_width: int, patience: Optional[float]) -> int:
    """openai-whisper's `round(beam_size * patience)`: the finished hypotheses a beam search waits for."""
    return round(beam_width * (patience or 1.0))


def _integer(name: str, value: Any) -> Optional[int]:
    """`value` as a Python int (None stays None); bools and non-integers are refused."""
    if value is None:
        return None
    _check(is_number(value, integer=True), f"{name} must be an integer, got {value!r}")
    return int(value)


def _strings(name: str, value: Any) -> list[str]:
    """A string or a list of non-empty strings, as a list (None: none)."""
    value = [] if value is None else [value] if isinstance(value, str) else value
    _check(isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value),
           f"{name} must be a string or a list of strings, got {value!r}")
    _check(all(value), f"{name} cannot contain an empty string")
    return list(value)


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _token_ids(name: str, value: Any) -> list[int]:
    """A list of token ids as Python ints; anything else names `name`."""
    _check(_is_list(value) and all(t is not None for t in value),
           f"{name} must be a list of token ids, got {value!r}")
    return [_integer(name, t) for t in value]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
