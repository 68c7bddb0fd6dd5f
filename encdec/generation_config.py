"""A checkpoint's decoding defaults (Hugging Face generation config) and per-request resolution.

`generation_config.json` wins when it exists; otherwise the generation fields of `config.json`
(older checkpoints such as facebook/bart-large-cnn keep them there). Keys the file does not set
take Hugging Face's defaults (greedy, 20 new tokens, ...), as `generate()` would; a checkpoint
with neither file setting any takes the built-in (vLLM's) defaults, as vLLM does. Speech models
(Whisper) decode greedily up to the decoder's length instead, file or no file (`for_speech`).

`resolve_sampling_params` turns a request's `SamplingParams` into concrete values. The config
fills the fields the request left unset, unless the request set `temperature`: that asks for
plain vLLM-style greedy or random sampling, and its unset fields take the built-in defaults.
A request with `config_per_field` (the server's, `encdec summarize`'s) takes the config for
each unset field all the same, as vLLM's server and Hugging Face's `generate()` do; its
`temperature` only says whether it samples: 0 decodes greedily or with the config's beams, above
0 samples, and the config's beams are left out.
Hugging Face counts `min_length` / `max_length` with the decoder prompt; here they become
`min_tokens` / `max_tokens` of the request's own prompt.
The generation fields of `config.json`'s `task_specific_params` (t5-small's "summarization": 4
beams, 30 to 200 tokens, ...) override the config for a request that names the task
(`SamplingParams.config_task`), as Hugging Face's pipeline for that task overrides them.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from encdec.sampling.params import BUILTIN_DEFAULTS, SamplingParams

logger = logging.getLogger(__name__)

GENERATION_FIELDS = (
    "do_sample", "num_beams", "temperature", "top_k", "top_p", "min_p", "length_penalty", "early_stopping",
    "no_repeat_ngram_size", "repetition_penalty", "min_length", "max_length", "min_new_tokens",
    "max_new_tokens", "forced_bos_token_id", "forced_eos_token_id", "bad_words_ids",
    "suppress_tokens", "begin_suppress_tokens", "renormalize_logits",
)
# Hugging Face GenerationConfig defaults for the fields above; without max_length (or
# max_new_tokens) `generate()` makes DEFAULT_NEW_TOKENS tokens after the decoder prompt.
HF_DEFAULTS = dict(do_sample=False, num_beams=1, temperature=1.0, top_k=50, top_p=1.0, min_p=None,
                   length_penalty=1.0, early_stopping=False, no_repeat_ngram_size=0,
                   repetition_penalty=1.0, min_length=0, max_length=None, min_new_tokens=None,
                   max_new_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
                   bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                   renormalize_logits=False)
DEFAULT_NEW_TOKENS = 20


@dataclass(frozen=True)
class GenerationDefaults:
    """The generation fields a checkpoint sets; `found` is False when it has none at all.
    `fallback` holds the values of the fields it leaves unset.
    `eos_token_ids` are the config's EOS tokens (`eos_token_id`, one or a list); those other
    than the model's own EOS stop every request as EOS does (vLLM adds them to stop_token_ids),
    set or not, unless it ignores EOS. `tasks` holds the generation fields of each entry of
    `task_specific_params` (`for_task`)."""

    values: dict[str, Any] = field(default_factory=dict)
    found: bool = False
    fallback: dict[str, Any] = field(default_factory=lambda: HF_DEFAULTS)
    eos_token_ids: tuple[int, ...] = ()
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, config: dict[str, Any], found: bool = True) -> "GenerationDefaults":
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else () if eos is None else (eos,)
        return cls(_generation_fields(config), found, eos_token_ids=eos_ids)

    def get(self, name: str) -> Any:
        return self.values.get(name, self.fallback[name])

    def for_task(self, task: Optional[str]) -> "GenerationDefaults":
        """These defaults with the generation fields of `task_specific_params[task]` over them
        (the same defaults for a task the checkpoint does not name)."""
        if not self.tasks.get(task):
            return self
        return dataclasses.replace(self, values={**self.values, **self.tasks[task]}, found=True)

    def for_speech(self, max_decoder_len: int) -> "GenerationDefaults":
        """A speech model's defaults: unset fields decode greedily up to the decoder's length (as
        openai-whisper does), and they apply even when the checkpoint has no config at all."""
        return dataclasses.replace(self, found=True,
                                   fallback={**HF_DEFAULTS, "max_length": max_decoder_len})

    def lengths(self, prompt_len: int) -> dict[str, int]:
        """`max_tokens` and `min_tokens` of the config for a decoder prompt of `prompt_len`."""
        max_length = self.get("max_length")
        max_tokens = (self.get("max_new_tokens") or
                      (DEFAULT_NEW_TOKENS if max_length is None else max_length - prompt_len))
        min_tokens = max(self.get("min_length") - prompt_len, self.get("min_new_tokens") or 0, 0)
        return dict(max_tokens=max(max_tokens, 1), min_tokens=min_tokens)

    def searches_beams(self, sample: Optional[bool] = None) -> bool:
        """Whether a request decodes with this config's beams: the config has num_beams > 1 and
        the request does not sample (`sample` True or False overrides the config's `do_sample`)."""
        sample = bool(self.get("do_sample")) if sample is None else sample
        return self.found and self.get("num_beams") > 1 and not sample

    def as_params(self, prompt_len: int, sample: Optional[bool] = None) -> dict[str, Any]:
        """SamplingParams values this config means for a decoder prompt of `prompt_len`;
        `sample` True or False overrides its `do_sample` (then a sampling request takes the
        config's temperature, top_k, top_p and min_p only if the config samples too)."""
        values = dict(
            **self.lengths(prompt_len),
            length_penalty=float(self.get("length_penalty")), early_stopping=self.get("early_stopping"),
            no_repeat_ngram_size=self.get("no_repeat_ngram_size"),
            repetition_penalty=float(self.get("repetition_penalty")),
            forced_bos_token_id=self.get("forced_bos_token_id"),
            forced_eos_token_id=self.get("forced_eos_token_id"),
            bad_words_ids=self.get("bad_words_ids"), suppress_tokens=self.get("suppress_tokens"),
            begin_suppress_tokens=self.get("begin_suppress_tokens"),
            renormalize_logits=bool(self.get("renormalize_logits")))
        config_samples = bool(self.get("do_sample"))
        sample = config_samples if sample is None else sample
        if self.get("num_beams") > 1:
            values.update(beam_width=self.get("num_beams"), use_beam_search=self.searches_beams(sample))
        if not sample:
            values.update(temperature=0.0)
        elif config_samples:  # Hugging Face's beam sampling has no equivalent here: it samples
            values.update(temperature=float(self.get("temperature")), top_k=self.get("top_k") or -1,
                          top_p=float(self.get("top_p")), min_p=float(self.get("min_p") or 0.0))
        return values


def load_generation_defaults(model: str) -> GenerationDefaults:
    """Read the defaults of a local checkpoint directory; anything else has none."""
    path = Path(model).expanduser()
    try:
        config = _json_object(path / "config.json")
        generation_config = _json_object(path / "generation_config.json")
        if generation_config is not None:
            defaults = GenerationDefaults.from_dict(generation_config)
        elif config is not None:
            defaults = GenerationDefaults.from_dict(config, any(k in config for k in GENERATION_FIELDS))
        else:
            return GenerationDefaults()
        tasks = (config or {}).get("task_specific_params")
        tasks = tasks if isinstance(tasks, dict) else {}
        return dataclasses.replace(defaults, tasks={
            task: _generation_fields(fields) for task, fields in tasks.items() if isinstance(fields, dict)})
    except (OSError, ValueError) as err:
        logger.warning("ignoring the generation config of %s: %s", model, err)
    return GenerationDefaults()


def _json_object(path: Path) -> Optional[dict[str, Any]]:
    """The JSON object in the file at `path`, None if there is no such file."""
    if not path.is_file():
        return None
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} holds no JSON object")
    return value


def _generation_fields(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in GENERATION_FIELDS if config.get(k) is not None}


def resolve_sampling_params(params: SamplingParams, defaults: GenerationDefaults, prompt_len: int,
                            max_decoder_len: int) -> SamplingParams:
    """Concrete decoding settings for one request whose decoder prompt has `prompt_len` tokens.

    A request asking for beam search gets no sampling settings from the config, one refusing it
    (`use_beam_search=False`) no beams. A default `max_tokens` (the config's or the built-in
    one) is capped by the room the decoder has after the prompt; a request's own beyond it is
    refused, as vLLM refuses it. `ignore_eos` also drops the config's `forced_eos_token_id`
    (a request's own stays), and `allowed_token_ids` the config's forced tokens it leaves out. Raises ValueError for combinations that are invalid once the
    defaults are in.
    """
    config = {}
    defaults = defaults.for_task(params.config_task)
    if defaults.found and (params.temperature is None or params.config_per_field):
        config = defaults.as_params(prompt_len, None if params.temperature is None else not params.is_greedy)
    values = {name: _own_or(getattr(params, name), config.get(name, builtin))
              for name, builtin in BUILTIN_DEFAULTS.items()}
    if params.is_beam_search or (params.use_beam_search is None and values["use_beam_search"]):
        if params.beam_width is None and values["beam_width"] < 2:
            raise ValueError(f"use_beam_search=True needs beam_width >= 2; the request sets none, and "
                             f"the default (the checkpoint's num_beams, else 1) is {values['beam_width']}")
        values.update(use_beam_search=True, temperature=_own_or(params.temperature, 0.0),
                      top_k=_own_or(params.top_k, -1), top_p=_own_or(params.top_p, 1.0),
                      min_p=_own_or(params.min_p, 0.0))
    else:
        values.update(use_beam_search=False, beam_width=1)
    room = decoder_room(max_decoder_len, prompt_len)
    if params.max_tokens is not None and params.max_tokens > room:
        raise ValueError(f"max_tokens={params.max_tokens} is more than the decoder has room for: it "
                         f"holds {max_decoder_len} positions and the decoder prompt takes "
                         f"{prompt_len} token{'s' * (prompt_len != 1)}, so at most {room} (the last "
                         f"new token takes no position)")
    values["max_tokens"] = min(values["max_tokens"], room)
    if params.min_tokens is None:  # a config's min_length never outlasts the length limit
        values["min_tokens"] = min(values["min_tokens"], values["max_tokens"])
    elif params.min_tokens > room:
        raise ValueError(f"min_tokens={params.min_tokens} is more than the decoder has room for: "
                         f"at most {room} after a decoder prompt of {prompt_len}")
    elif params.max_tokens is None and params.min_tokens > values["max_tokens"]:
        raise ValueError(f"min_tokens={params.min_tokens} is more than the default max_tokens="
                         f"{values['max_tokens']} (the checkpoint's generation config, else "
                         f"encdec's); set max_tokens too")
    if params.ignore_eos and params.forced_eos_token_id is None:  # no EOS the request did not ask for
        values["forced_eos_token_id"] = None
    for name in ("forced_bos_token_id", "forced_eos_token_id"):  # the config's give way to allowed tokens
        if getattr(params, name) is None and params.allowed_token_ids is not None \
                and values[name] not in params.allowed_token_ids:
            values[name] = None
    if not params.ignore_eos:
        values["stop_token_ids"] = params.stop_token_ids + [
            t for t in defaults.eos_token_ids if t not in params.stop_token_ids]
    return dataclasses.replace(params, **values)


def decoder_room(max_decoder_len: int, prompt_len: int) -> int:
    """New tokens a decoder of `max_decoder_len` positions has room for after a prompt of
    `prompt_len` tokens: the last one is never fed back, so it takes no position (as in Hugging
    Face's generate() and openai-whisper)."""
    return max_decoder_len + 1 - prompt_len


def _own_or(own: Any, default: Any) -> Any:
    return default if own is None else own


def task_prefix(hf_config: Any, task: str) -> str:
    """The text a checkpoint wants in front of its input for `task` ("summarization",
    "translation_en_to_de", ...), from its config's `task_specific_params` (T5: "summarize: ");
    "" if it names none."""
    task_params = getattr(hf_config, "task_specific_params", None) or {}
    return (task_params.get(task) or {}).get("prefix") or ""
