"""Model families: a config's `architectures` (else its `model_type`) -> the model class and the pieces the loader adds to
a checkpoint (special tokens, default decoder prompt, length limits, audio processor, CTranslate2
name mapping), and how a translation model takes its languages.

Families name their code as "module:attribute", imported on first use, so that loading BART
never imports Whisper's audio front end.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from encdec.config import SpecialTokens


@dataclass(frozen=True)
class TextTokens:
    """The special tokens of a text model, as its config declares them."""

    decoder_start_token_id: int
    eos_token_id: Optional[int]
    extra_decoder_start_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class InputHooks:
    """What a family adds to one checkpoint for the input side, resolved once at load.
    `audio_processor` turns an audio source into (encoder features, encoder length);
    `max_lengths` (encoder, decoder) is for configs without position limits (T5)."""

    special_tokens: SpecialTokens
    default_decoder_prompt: list[int]
    audio_processor: Optional[Callable[[Any], tuple[Any, int]]] = None
    max_lengths: Optional[tuple[int, int]] = None


@dataclass(frozen=True)
class TranslationInputs:
    """A text to translate as encoder token ids, and the decoder's forced first token (mBART-50's
    target language code) if the model needs one. `unused`: the language arguments given that
    the checkpoint has no use for ("source_lang", "target_lang"), each with the reason."""

    prompt_token_ids: list[int]
    forced_bos_token_id: Optional[int] = None
    unused: tuple[tuple[str, str], ...] = ()


class LanguageError(ValueError):
    """A language the checkpoint cannot translate from or into; `field` is "source_lang" or
    "target_lang", the argument to change."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def decoder_start_token_id(hf_config: Any, generation_config: Optional[dict] = None) -> int:
    """<DEC>: the decoder_start_token_id, else the bos token (as Hugging Face's generate()),
    else the pad token (T5); each from the generation config first, then the model config."""
    for name in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
        token = (generation_config or {}).get(name)
        if token is None:
            token = getattr(hf_config, name, None)
        if token is not None:
            return token
    raise ValueError("the model config names no decoder_start_token_id, bos_token_id or pad_token_id")


def text_input_hooks(hf_config: Any, tokenizer: Any = None,
                     generation_config: Optional[dict] = None) -> InputHooks:
    """Text models: tokens from the config; the default decoder prompt is [<DEC>], where Hugging
    Face's generate() starts (T5, PEGASUS, Marian: the pad token; mBART: </s>)."""
    start = decoder_start_token_id(hf_config, generation_config)
    return InputHooks(TextTokens(start, hf_config.eos_token_id), [start])


@dataclass(frozen=True)
class ModelFamily:
    """One family: its Hugging Face `model_type`, model class, input hooks (a function of
    `(hf_config, tokenizer, generation_config)`), for translation models the function that
    builds `TranslationInputs` from `(tokenizer, hf_config, text, source_lang, target_lang)`,
    and, when CTranslate2 files of the family can be read, their spec name and the function
    mapping their variables to Hugging Face names."""

    model_type: str
    model_class: str
    input_hooks: Optional[str] = None  # None: `text_input_hooks`
    translation: Optional[str] = None
    ct2_spec: Optional[str] = None
    ct2_to_hf: Optional[str] = None

    def get_model_class(self) -> type:
        return _import(self.model_class)

    def get_input_hooks(self, hf_config: Any, tokenizer: Any,
                        generation_config: Optional[dict]) -> InputHooks:
        hooks = _import(self.input_hooks) if self.input_hooks else text_input_hooks
        return hooks(hf_config, tokenizer, generation_config)


_T5 = ModelFamily("t5", "encdec.models.t5:T5ForConditionalGeneration",
                  input_hooks="encdec.models.t5:t5_input_hooks",
                  translation="encdec.models.t5:t5_translation")

_FAMILIES = {
    "BartForConditionalGeneration": ModelFamily(
        "bart", "encdec.models.bart:BartForConditionalGeneration",
        input_hooks="encdec.models.bart:bart_input_hooks"),
    "MBartForConditionalGeneration": ModelFamily(
        "mbart", "encdec.models.mbart:MBartForConditionalGeneration",
        translation="encdec.models.mbart:mbart50_translation"),
    "MarianMTModel": ModelFamily(
        "marian", "encdec.models.marian:MarianMTModel",
        translation="encdec.models.marian:marian_translation"),
    "PegasusForConditionalGeneration": ModelFamily(
        "pegasus", "encdec.models.pegasus:PegasusForConditionalGeneration"),
    "T5ForConditionalGeneration": _T5,
    "T5WithLMHeadModel": _T5,  # the name older T5 configs carry
    "MT5ForConditionalGeneration": _T5,  # mT5 is T5 v1.1, layer for layer
    "WhisperForConditionalGeneration": ModelFamily(
        "whisper", "encdec.models.whisper:WhisperForConditionalGeneration",
        input_hooks="encdec.models.whisper_inputs:whisper_input_hooks",
        ct2_spec="WhisperSpec", ct2_to_hf="encdec.models.whisper_ct2:ct2_whisper_to_hf"),
}


def get_model_family(hf_config: Any) -> ModelFamily:
    """The family of a config: by its `architectures`, or, when it names none, by its
    `model_type` (as Hugging Face's Auto classes pick; "mt5" is T5's). An architecture it names
    that is not a generation model (an encoder alone, a classifier) is refused."""
    architectures = getattr(hf_config, "architectures", None) or []
    for arch in architectures:
        if arch in _FAMILIES:
            return _FAMILIES[arch]
    model_type = getattr(hf_config, "model_type", None)
    by_type = {family.model_type: family for family in _FAMILIES.values()} | {"mt5": _T5}
    if not architectures and model_type in by_type:
        return by_type[model_type]
    raise ValueError(f"unsupported model: architectures {architectures}, model_type {model_type!r}; "
                     f"supported: {sorted(_FAMILIES)}")


def translation_inputs(tokenizer: Any, hf_config: Any, text: str, source_lang: Optional[str] = None,
                       target_lang: Optional[str] = None) -> TranslationInputs:
    """How this checkpoint takes `text` to translate: mBART-50 language codes ("en_XX", or "en"),
    a Marian multilingual model's target token (">>fr<<"), T5's task prefix. Raises ValueError
    for a family that does not translate, LanguageError for a language it does not know."""
    family = get_model_family(hf_config)
    if family.translation is None:
        translators = sorted({f.model_type for f in _FAMILIES.values() if f.translation})
        raise ValueError(f"{family.model_type} models do not translate; use one of {translators}")
    return _import(family.translation)(tokenizer, hf_config, text, source_lang, target_lang)


def translation_task(source_lang: Optional[str], target_lang: Optional[str]) -> Optional[str]:
    """The `task_specific_params` entry a translation takes ("translation_en_to_de": T5's, as
    Hugging Face's translation pipeline takes it); None without both languages."""
    return f"translation_{source_lang}_to_{target_lang}" if source_lang and target_lang else None


def get_ct2_converter(spec_name: Optional[str]) -> Callable[..., Any]:
    """The CTranslate2 -> Hugging Face name mapping of the family whose spec is `spec_name`."""
    converters = {f.ct2_spec: f.ct2_to_hf for f in _FAMILIES.values() if f.ct2_spec}
    if spec_name not in converters:
        raise ValueError(f"no model family reads CTranslate2 {spec_name} models; "
                         f"supported: {sorted(converters)}")
    return _import(converters[spec_name])


def _import(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
