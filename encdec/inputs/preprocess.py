"""Turn any accepted prompt into `EncoderDecoderInputs`, validating it at the edge.

Encoder side: text is tokenized with special tokens, token ids pass unchanged, audio (or
log-mel frames made already) becomes features through the model's audio processor, an audio model's `CrossKVPrompt` (cross keys and
values from an earlier output) is checked against the cache's shape and replaces the encoder.
Decoder side: None gives the model's default decoder prompt (BART: [<DEC>, <BOS>] = [2, 0]);
text is tokenized as the tokenizer's target side (`text_target`: Marian's target
SentencePiece model) without special tokens; any token list not starting with <DEC>
(decoder_start_token_id) gets it prepended, unless it starts with one of the model's
`extra_decoder_start_token_ids` (Whisper's <|startofprev|>, which opens a text prompt before
<|startoftranscript|>). The model family supplies the default prompt, the
special tokens and the audio processor (`encdec.models.registry`).
A singleton prompt with audio and text (or token ids), vLLM's Whisper prompt
`{"prompt": "<|startoftranscript|>...", "multi_modal_data": {"audio": ...}}`, has the audio go to
the encoder and the text start the decoder; an explicit `encoder_prompt` with audio takes no text.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Optional

import numpy as np
import torch

from encdec.config import ModelConfig
from encdec.inputs.data import is_explicit_encoder_decoder_prompt
from encdec.inputs.tokenizing import encode
from encdec.sequence import EncoderDecoderInputs

# audio source -> (encoder features, encoder sequence length); its `features(frames)` takes
# log-mel frames (`encdec.whisper.processor.WhisperAudioProcessor`)
AudioProcessor = Callable[[Any], tuple[Any, int]]


class InputPreprocessor:
    def __init__(self, model_config: ModelConfig, tokenizer: Any, default_decoder_prompt: list[int],
                 audio_processor: Optional[AudioProcessor] = None):
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.audio_processor = audio_processor
        self.default_decoder_prompt = default_decoder_prompt
        tokens = model_config.special_tokens
        self.decoder_starts = {tokens.decoder_start_token_id, *tokens.extra_decoder_start_token_ids}

    def preprocess(self, prompt: Any, truncate_prompt_tokens: Optional[int] = None) -> EncoderDecoderInputs:
        """`prompt`'s token ids, checked; a text or token-id encoder prompt cut to its last
        `truncate_prompt_tokens` (-1: the encoder's limit), as vLLM cuts prompts."""
        if is_explicit_encoder_decoder_prompt(prompt):
            _check_processor_kwargs(prompt, "prompt")
            unknown = set(prompt) - {"encoder_prompt", "decoder_prompt", "mm_processor_kwargs"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)} in an encoder/decoder prompt")
            encoder_prompt, decoder_prompt = prompt["encoder_prompt"], prompt.get("decoder_prompt")
        elif isinstance(prompt, dict) and prompt.get("multi_modal_data") and (
                prompt.get("prompt") or prompt.get("prompt_token_ids") is not None):
            _parse_singleton(prompt, "prompt")  # its keys, named as given
            decoder_prompt = {key: value for key, value in prompt.items() if key in ("prompt", "prompt_token_ids")}
            encoder_prompt = {"prompt": "", "multi_modal_data": prompt["multi_modal_data"]}
        else:
            encoder_prompt, decoder_prompt = prompt, None
        cross_kv = None
        if isinstance(encoder_prompt, dict) and "cross_kv" in encoder_prompt:
            cross_kv = self._cross_kv(encoder_prompt)
            enc_text, enc_ids, features = None, [0] * cross_kv[0][0].shape[1], None
        else:
            enc_text, enc_ids, features = self._encoder_side(encoder_prompt, truncate_prompt_tokens)
        dec_text, dec_ids = self._decoder_side(decoder_prompt)
        return EncoderDecoderInputs(encoder_prompt_token_ids=enc_ids, prompt_token_ids=dec_ids,
                                    encoder_prompt=enc_text, prompt=dec_text,
                                    encoder_features=features, cross_kv=cross_kv)

    def _cross_kv(self, prompt: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A `CrossKVPrompt`'s (keys, values) per decoder layer, checked against the cache."""
        if set(prompt) != {"cross_kv"}:
            raise ValueError(f"encoder_prompt with 'cross_kv' takes no other keys, got {sorted(prompt)}")
        if self.audio_processor is None:
            raise ValueError("encoder_prompt['cross_kv'] is for audio models (Whisper): this "
                             "model's encoder takes text")
        config = self.model_config
        layers = prompt["cross_kv"]
        if not isinstance(layers, (list, tuple)) or len(layers) != config.num_decoder_layers:
            raise ValueError(f"encoder_prompt['cross_kv'] must hold (keys, values) for each of the "
                             f"model's {config.num_decoder_layers} decoder layers")
        first = layers[0][0] if isinstance(layers[0], (list, tuple)) and layers[0] else None
        length = first.shape[1] if isinstance(first, torch.Tensor) and first.dim() == 3 else 0
        shape = (config.num_decoder_heads, length, config.head_size)
        for pair in layers:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
                    isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == config.dtype
                    for t in pair)):
                raise ValueError(f"encoder_prompt['cross_kv']: every layer needs (keys, values), "
                                 f"each a {config.dtype} tensor [num_heads={shape[0]}, "
                                 f"encoder_len, head_size={shape[2]}] of one encoder_len")
        if not 0 < length <= config.max_encoder_len:
            raise ValueError(f"encoder_prompt['cross_kv'] covers {length} encoder positions; the "
                             f"model takes 1 to {config.max_encoder_len}")
        return [tuple(pair) for pair in layers]

    def _encoder_side(self, prompt: Any, truncate: Optional[int]) -> tuple[Optional[str], list[int], Any]:
        text, ids, mm_data = _parse_singleton(prompt, "encoder_prompt")
        limit = self.model_config.max_encoder_len
        if mm_data:
            if text or ids is not None:
                raise ValueError("encoder_prompt with multi_modal_data takes no text or token ids (the "
                                 "audio is what the encoder reads): give them as decoder_prompt")
            if set(mm_data) not in ({"audio"}, {"audio_features"}):
                raise ValueError(f"multi_modal_data takes one of 'audio' (a waveform or file) and "
                                 f"'audio_features' (log-mel frames), got {sorted(mm_data)}")
            if self.audio_processor is None:
                raise ValueError(f"this model takes no audio: multi_modal_data[{next(iter(mm_data))!r}] "
                                 f"is for Whisper")
            if "audio" in mm_data:
                features, length = self.audio_processor(_one_audio(mm_data["audio"]))
            else:
                features, length = self.audio_processor.features(mm_data["audio_features"])
            return text, [0] * length, features
        if self.audio_processor is not None:
            raise ValueError("this model's encoder takes audio: pass "
                             "{'prompt': '', 'multi_modal_data': {'audio': (waveform, sample_rate)}}")
        if ids is None:
            if text == "":
                raise ValueError("encoder_prompt is empty: give some text or token ids")
            ids = self._tokenize(text=text, add_special_tokens=True)
        if not ids:
            raise ValueError("encoder_prompt is empty: give at least one token id")
        ids = truncate_prompt(ids, truncate, limit)
        if len(ids) > limit:
            raise ValueError(f"encoder_prompt has {len(ids)} tokens, more than the model's "
                             f"maximum of {limit}")
        self._check_vocab(ids, "encoder_prompt", self.model_config.encoder_vocab_size)
        return text, ids, None

    def _decoder_side(self, prompt: Any) -> tuple[Optional[str], list[int]]:
        if prompt is None:
            return None, list(self.default_decoder_prompt)
        text, ids, mm_data = _parse_singleton(prompt, "decoder_prompt")
        if mm_data:
            raise ValueError("decoder_prompt cannot carry multi_modal_data")
        if ids is None:
            ids = self._tokenize(text_target=text, add_special_tokens=False)
        if not ids or ids[0] not in self.decoder_starts:
            ids = [self.model_config.decoder_start_token_id] + list(ids)
        limit = self.model_config.max_decoder_len
        if len(ids) > limit:
            raise ValueError(f"decoder_prompt has {len(ids)} tokens (with <DEC>), more than the "
                             f"model's {limit} decoder positions")
        self._check_vocab(ids, "decoder_prompt", self.model_config.vocab_size)
        return text, ids

    def _tokenize(self, **text_and_options: Any) -> list[int]:
        """Token ids of `text=` (encoder side) or `text_target=` (decoder side); a text over the
        model's length is the caller's to cut or refuse (no tokenizer warning)."""
        if self.tokenizer is None:
            raise ValueError("the model directory has no tokenizer: pass token ids "
                             "({'prompt_token_ids': [...]}) instead of text")
        return encode(self.tokenizer, **text_and_options, verbose=False)

    def _check_vocab(self, ids: list[int], field: str, vocab: int) -> None:
        bad = [t for t in ids if not isinstance(t, int) or t < 0 or t >= vocab]
        if bad:
            raise ValueError(f"{field} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")


def truncate_prompt(ids: list[int], truncate_prompt_tokens: Optional[int], limit: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: the last k ids (-1: the last `limit`; None: all); a k
    past `limit` is refused, as vLLM refuses one past the model's length."""
    if truncate_prompt_tokens is None:
        return ids
    if truncate_prompt_tokens > limit:
        raise ValueError(f"truncate_prompt_tokens is {truncate_prompt_tokens}, more than the encoder's "
                         f"{limit} positions (-1 keeps the last {limit} tokens)")
    return ids[-(limit if truncate_prompt_tokens == -1 else truncate_prompt_tokens):]


def _parse_singleton(prompt: Any, field: str) -> tuple[Optional[str], Optional[list[int]], Optional[dict]]:
    """(text, token ids, multi_modal_data) of a singleton prompt; exactly one of text/ids set."""
    if isinstance(prompt, str):
        return _checked_text(prompt, field), None, None
    if isinstance(prompt, (list, tuple, np.ndarray, torch.Tensor)):
        return None, _as_ids(prompt, field), None
    if isinstance(prompt, dict):
        mm_data = prompt.get("multi_modal_data")
        if mm_data is not None and not isinstance(mm_data, dict):
            raise ValueError(f"{field}['multi_modal_data'] must be a dict such as {{'audio': (waveform, "
                             f"sample_rate)}}, got {type(mm_data).__name__}")
        _check_processor_kwargs(prompt, field)
        if unknown := set(prompt) - {"prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs"}:
            raise ValueError(f"{field} has unknown keys {sorted(unknown)}: expected a TextPrompt "
                             "{'prompt'}, a TokensPrompt {'prompt_token_ids'} or, at the top level, "
                             "{'encoder_prompt', 'decoder_prompt'}")
        if "prompt" in prompt and "prompt_token_ids" in prompt:
            raise ValueError(f"{field} takes 'prompt' or 'prompt_token_ids', not both")
        if "prompt_token_ids" in prompt:
            return None, _as_ids(prompt["prompt_token_ids"], field), mm_data
        if "prompt" in prompt:
            if not isinstance(prompt["prompt"], str):
                raise ValueError(f"{field}['prompt'] must be a string, got {type(prompt['prompt']).__name__}")
            return _checked_text(prompt["prompt"], f"{field}['prompt']"), None, mm_data
        if mm_data:
            return None, None, mm_data
        raise ValueError(f"{field} holds neither 'prompt' nor 'prompt_token_ids'")
    raise ValueError(f"{field} of type {type(prompt).__name__} is not a prompt: expected str, "
                     "TextPrompt, TokensPrompt, a list of token ids or ExplicitEncoderDecoderPrompt")


def _check_processor_kwargs(prompt: dict, field: str) -> None:
    """vLLM's `mm_processor_kwargs`, which its prompt builders set to {}: the audio processor
    takes no options, so only an empty one is taken."""
    if prompt.get("mm_processor_kwargs"):
        raise ValueError(f"{field}['mm_processor_kwargs']: the audio processor takes no options, "
                         f"got {prompt['mm_processor_kwargs']!r}")


def _one_audio(audio: Any) -> Any:
    """vLLM's list of audios for `multi_modal_data['audio']`, which for Whisper holds one, as
    that one; a (waveform, sample_rate) pair given as a list, or a list of samples, as it is."""
    if isinstance(audio, list) and not audio:
        raise ValueError("multi_modal_data['audio'] is an empty list: a Whisper prompt takes one audio")
    if (not isinstance(audio, list) or isinstance(audio[0], numbers.Number)
            or (len(audio) == 2 and isinstance(audio[1], numbers.Number))):
        return audio
    if len(audio) != 1:
        raise ValueError(f"multi_modal_data['audio'] holds {len(audio)} audios: a Whisper prompt "
                         f"takes one")
    return audio[0]


def _checked_text(text: str, field: str) -> str:
    """`text`, refused when it cannot be encoded (a lone UTF-16 surrogate such as '\\ud800')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{field} is not valid Unicode: {err.reason} at character {err.start}") from None
    return text


def _as_ids(ids: Any, field: str) -> list[int]:
    """Token ids as Python ints: from a list or tuple, or a 1-D NumPy array or torch tensor."""
    if isinstance(ids, (np.ndarray, torch.Tensor)):
        if ids.dtype.is_floating_point if isinstance(ids, torch.Tensor) else np.issubdtype(ids.dtype, np.floating):
            raise ValueError(f"{field} is an array of {ids.dtype}, not token ids: a waveform goes in "
                             "{'prompt': '', 'multi_modal_data': {'audio': (waveform, sample_rate)}}")
        if ids.ndim != 1:
            raise ValueError(f"{field} token ids must be 1-D, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    elif not isinstance(ids, (list, tuple)):
        raise ValueError(f"{field} token ids must be a list of integers, got {type(ids).__name__}")
    out = []
    for t in ids:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
            raise ValueError(f"{field} token ids must be integers, got {t!r}")
        out.append(int(t))
    return out
