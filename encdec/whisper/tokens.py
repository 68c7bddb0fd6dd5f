"""Whisper's special tokens and the decoder prefix (as openai-whisper's `tokenizer.py` spells it).

Ids come from the tokenizer when there is one (its vocabulary is the truth), then from
generation_config.json, then from config.json. Standard Whisper vocabularies end with
<|notimestamps|> followed by 1501 timestamp tokens, preceded by <|translate|>, <|transcribe|>,
<|startoflm|>, <|startofprev|>, <|nocaptions|>; that layout is the last fallback.
The one place Whisper's ids are found: the model's input hooks (at load) and the CTranslate2
conversion both resolve them here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

NUM_TIMESTAMP_TOKENS = 1501  # <|0.00|> .. <|30.00|>
MULTILINGUAL_VOCAB_SIZE = 51865  # Hugging Face: is_multilingual = vocab_size >= 51865
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")


@dataclass(frozen=True)
class WhisperTokens:
    """Special-token ids of one Whisper model; `lang_to_id` maps "en" -> id of <|en|>. Also the
    model's `SpecialTokens` (`encdec.config`): <|startoftranscript|> starts, <|endoftext|> ends."""

    eot: int
    sot: int
    no_timestamps: Optional[int]
    multilingual: bool
    lang_to_id: dict[str, int] = field(default_factory=dict)
    task_to_id: dict[str, int] = field(default_factory=dict)
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    no_speech: Optional[int] = None  # <|nospeech|> (<|nocaptions|> in older vocabularies)
    sot_prev: Optional[int] = None  # <|startofprev|>: opens a text prompt before sot
    sot_lm: Optional[int] = None
    # (decoder layer, head) pairs whose cross-attention follows the audio (word timestamps)
    alignment_heads: tuple[tuple[int, int], ...] = ()

    @property
    def decoder_start_token_id(self) -> int:
        return self.sot

    @property
    def eos_token_id(self) -> int:
        return self.eot

    @property
    def extra_decoder_start_token_ids(self) -> tuple[int, ...]:
        """<|startofprev|> may open a decoder prompt (previous text before <|startoftranscript|>)."""
        return () if self.sot_prev is None else (self.sot_prev,)

    @property
    def timestamp_begin(self) -> Optional[int]:
        """Id of <|0.00|>; ids from here up are timestamps, 0.02 s apart."""
        return None if self.no_timestamps is None else self.no_timestamps + 1

    def language_of(self, token_id: int) -> Optional[str]:
        return next((lang for lang, i in self.lang_to_id.items() if i == token_id), None)

    def decoder_prefix(self, language: Optional[str] = "en", task: str = "transcribe",
                       timestamps: bool = False) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>].

        Multilingual models get the language (None leaves it to the model) and the task;
        English-only models take neither.
        """
        ids = [self.sot]
        if self.multilingual:
            if language is not None:
                if language not in self.lang_to_id:
                    raise ValueError(f"language: {language!r} is not one of this model's "
                                     f"{len(self.lang_to_id)} languages")
                ids.append(self.lang_to_id[language])
            if task not in self.task_to_id:
                raise ValueError(f"task {task!r} is not one of {sorted(self.task_to_id)}")
            ids.append(self.task_to_id[task])
        elif language not in (None, "en") or task != "transcribe":
            raise ValueError(f"this Whisper model is English-only: language={language!r}, "
                             f"task={task!r} need a multilingual model")
        if not timestamps and self.no_timestamps is not None:
            ids.append(self.no_timestamps)
        return ids


def is_multilingual(vocab_size: int, generation_config: Optional[dict] = None) -> bool:
    """Hugging Face's rule: the generation config's `is_multilingual`, else a vocabulary of
    51865 tokens or more."""
    return bool((generation_config or {}).get("is_multilingual", vocab_size >= MULTILINGUAL_VOCAB_SIZE))


def whisper_tokens(hf_config: Any, tokenizer: Any = None,
                   generation_config: Optional[dict] = None) -> WhisperTokens:
    """Resolve the special tokens from the tokenizer, generation config and model config."""
    return whisper_tokens_from_vocab(_added_vocab(tokenizer), hf_config.vocab_size,
                                     generation_config, hf_config)


def whisper_tokens_from_vocab(added: Mapping[str, int], vocab_size: int,
                              generation_config: Optional[dict] = None,
                              hf_config: Any = None) -> WhisperTokens:
    """Resolve the special tokens from a vocabulary's added tokens (content -> id), then the
    generation config, then the model config (either may be None), then the standard layout."""
    gen = generation_config or {}
    added = {tok: i for tok, i in added.items() if tok.startswith("<|") and tok.endswith("|>")}
    layout = _standard_layout(vocab_size)
    eot = _first_int(added.get("<|endoftext|>"), gen.get("eos_token_id"),
                     getattr(hf_config, "eos_token_id", None))
    sot = _first_int(added.get("<|startoftranscript|>"), gen.get("decoder_start_token_id"),
                     getattr(hf_config, "decoder_start_token_id", None))
    if eot is None or sot is None:
        raise ValueError("cannot tell Whisper's <|endoftext|> / <|startoftranscript|> ids: "
                         "no tokenizer and no eos_token_id / decoder_start_token_id in the config")
    gen_tasks = gen.get("task_to_id") or {}
    tasks = {task: _first_int(added.get(f"<|{task}|>"), gen_tasks.get(task), layout.get(task))
             for task in ("translate", "transcribe")}
    no_timestamps = _first_int(added.get("<|notimestamps|>"), gen.get("no_timestamps_token_id"),
                               layout.get("no_timestamps"))
    return WhisperTokens(
        eot=eot, sot=sot, no_timestamps=no_timestamps,
        multilingual=is_multilingual(vocab_size, gen),
        lang_to_id=_languages(added, gen, sot),
        task_to_id={task: i for task, i in tasks.items() if i is not None},
        suppress_tokens=tuple(_first_list(gen, hf_config, "suppress_tokens")),
        begin_suppress_tokens=tuple(_first_list(gen, hf_config, "begin_suppress_tokens")),
        no_speech=_first_int(added.get("<|nospeech|>"), added.get("<|nocaptions|>"),
                             layout.get("no_speech")),
        sot_prev=_first_int(added.get("<|startofprev|>"), gen.get("prev_sot_token_id"),
                            layout.get("sot_prev")),
        sot_lm=_first_int(added.get("<|startoflm|>"), layout.get("sot_lm")),
        alignment_heads=_alignment_heads(gen, hf_config, vocab_size),
    )


def _first_int(*values: Any) -> Optional[int]:
    """The first value that is an int (eos_token_id may be a list in some configs: skipped)."""
    return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)


def _added_vocab(tokenizer: Any) -> dict[str, int]:
    if tokenizer is None or not hasattr(tokenizer, "get_added_vocab"):
        return {}
    return tokenizer.get_added_vocab()


def _standard_layout(vocab_size: int) -> dict[str, int]:
    if vocab_size <= NUM_TIMESTAMP_TOKENS + 6:
        return {}
    no_timestamps = vocab_size - NUM_TIMESTAMP_TOKENS - 1
    return {"no_timestamps": no_timestamps, "no_speech": no_timestamps - 1,
            "sot_prev": no_timestamps - 2, "sot_lm": no_timestamps - 3,
            "transcribe": no_timestamps - 4, "translate": no_timestamps - 5}


def _languages(added: dict[str, int], gen: dict, sot: int) -> dict[str, int]:
    """Language code -> id, from the tokenizer, else generation_config's `lang_to_id`, else
    the standard layout's first language (<|en|> right after <|startoftranscript|>)."""
    found = {m.group(1): i for tok, i in added.items() if (m := _LANGUAGE_TOKEN.match(tok))}
    if not found:
        found = {m.group(1): i for tok, i in (gen.get("lang_to_id") or {}).items()
                 if (m := _LANGUAGE_TOKEN.match(tok))}
    return found or {"en": sot + 1}


# Bundled models' alignment heads (openai-whisper's table), by (decoder layers, heads, vocabulary).
BUILTIN_ALIGNMENT_HEADS = {
    (4, 6, 51864): ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),  # tiny.en
    (6, 8, 51865): ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),  # base
}


def _alignment_heads(gen: dict, hf_config: Any, vocab_size: int) -> tuple[tuple[int, int], ...]:
    """From the generation config or the model config, else the built-in table, else (as
    openai-whisper) every head of the decoder's second half."""
    heads = _first_list(gen, hf_config, "alignment_heads")
    if heads:
        return tuple((int(layer), int(head)) for layer, head in heads)
    layers = getattr(hf_config, "decoder_layers", 0)
    num_heads = getattr(hf_config, "decoder_attention_heads", 0)
    return BUILTIN_ALIGNMENT_HEADS.get((layers, num_heads, vocab_size), tuple(
        (layer, head) for layer in range(layers // 2, layers) for head in range(num_heads)))


def _first_list(gen: dict, hf_config: Any, key: str) -> list:
    value = gen.get(key)
    if value is None:
        value = getattr(hf_config, key, None)
    return list(value or [])
