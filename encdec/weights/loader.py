"""Resolve a model name or directory into a ready model, its config, tokenizer and input hooks."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from encdec.attention.selector import get_attn_backend
from encdec.config import ModelConfig
from encdec.kernels.cpu_linear import packed_linear_supported
from encdec.models.layers import pack_linears
from encdec.models.registry import get_model_class


@dataclass
class LoadedModel:
    model: torch.nn.Module
    model_config: ModelConfig
    tokenizer: Any
    default_decoder_prompt: Optional[list[int]] = None
    audio_processor: Optional[Callable[[Any], tuple[Any, int]]] = None


def model_config_from_hf(name: str, hf_config: Any, dtype: torch.dtype) -> ModelConfig:
    """Limits and special tokens from a Hugging Face config (BART or Whisper field names)."""
    max_encoder = getattr(hf_config, "max_source_positions", None) or hf_config.max_position_embeddings
    max_decoder = getattr(hf_config, "max_target_positions", None) or hf_config.max_position_embeddings
    return ModelConfig(model=name, hf_config=hf_config, dtype=dtype, max_encoder_len=max_encoder,
                       max_decoder_len=max_decoder, vocab_size=hf_config.vocab_size,
                       decoder_start_token_id=hf_config.decoder_start_token_id,
                       bos_token_id=hf_config.bos_token_id, eos_token_id=hf_config.eos_token_id)


def build_model(hf_config: Any, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype,
                device: torch.device, attention_backend: Optional[str]) -> torch.nn.Module:
    model_cls = get_model_class(getattr(hf_config, "architectures", None))
    with torch.device("meta"):  # no random init: every tensor comes from the checkpoint
        model = model_cls(hf_config, get_attn_backend(device, attention_backend))
    model.to_empty(device="cpu")
    model.load_weights(weights)
    model = model.to(device=device, dtype=dtype).eval()
    if packed_linear_supported(device, dtype):
        pack_linears(model)
    return model


def load_hf_directory(path: Path, dtype: torch.dtype, device: torch.device,
                      attention_backend: Optional[str]) -> LoadedModel:
    """A local Hugging Face checkpoint directory: config.json, weights, tokenizer files."""
    from transformers import AutoConfig, AutoTokenizer

    from encdec.weights.hf import iterate_weights

    hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    model = build_model(hf_config, iterate_weights(path), dtype, device, attention_backend)
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    loaded = LoadedModel(model, model_config_from_hf(str(path), hf_config, dtype), tokenizer)
    if getattr(hf_config, "model_type", None) == "whisper":
        generation_config = path / "generation_config.json"
        return with_whisper_hooks(loaded, json.loads(generation_config.read_text())
                                  if generation_config.exists() else None)
    return loaded


def load_ct2_whisper_model(name: str, dtype: torch.dtype, device: torch.device,
                           attention_backend: Optional[str]) -> LoadedModel:
    """A CTranslate2 Whisper model (alias "tiny.en" / "base", or a directory with model.bin):
    weights converted to Hugging Face names, the tokenizer from its tokenizer.json, suppress
    lists and language ids from its config.json."""
    from transformers import PreTrainedTokenizerFast, WhisperConfig

    from encdec.weights.ct2 import load_ct2_whisper
    from encdec.weights.whisper_assets import resolve_whisper_model

    assets = resolve_whisper_model(name)
    if assets.tokenizer_json is None:
        raise ValueError(f"{assets.name}: no tokenizer.json beside model.bin")
    config, state = load_ct2_whisper(assets)
    hf_config = WhisperConfig(**config, architectures=["WhisperForConditionalGeneration"])
    model = build_model(hf_config, state.items(), dtype, device, attention_backend)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(assets.tokenizer_json))
    loaded = LoadedModel(model, model_config_from_hf(assets.name, hf_config, dtype), tokenizer)
    return with_whisper_hooks(loaded, config)


def with_whisper_hooks(loaded: LoadedModel, generation_config: Optional[dict] = None) -> LoadedModel:
    """Whisper: <|startoftranscript|> / <|endoftext|> as start / end, the control-token prefix
    as the default decoder prompt, and log-mel features for audio prompts.

    The resolved suppress lists and <|startofprev|> (a second accepted first decoder token)
    are written into the HF config, so later readers of the config see the same tokens."""
    from encdec.whisper import whisper_input_hooks

    hf_config = loaded.model_config.hf_config
    hooks = whisper_input_hooks(hf_config, loaded.tokenizer, generation_config)
    hf_config.suppress_tokens = list(hooks.tokens.suppress_tokens)
    hf_config.begin_suppress_tokens = list(hooks.tokens.begin_suppress_tokens)
    hf_config.extra_decoder_start_token_ids = (
        [] if hooks.tokens.sot_prev is None else [hooks.tokens.sot_prev])
    model_config = dataclasses.replace(loaded.model_config, decoder_start_token_id=hooks.tokens.sot,
                                       eos_token_id=hooks.tokens.eot)
    return dataclasses.replace(loaded, model_config=model_config,
                               default_decoder_prompt=hooks.default_decoder_prompt,
                               audio_processor=hooks.audio_processor)


def load_model(model: str, dtype: torch.dtype, device: torch.device,
               attention_backend: Optional[str] = None) -> LoadedModel:
    """A local Hugging Face checkpoint directory, or a CTranslate2 Whisper model: an alias of
    a bundled one ("tiny.en", "base") or a directory holding model.bin (or its parts)."""
    from encdec.weights.whisper_assets import ALIASES

    path = Path(model).expanduser()
    if model in ALIASES or (path.is_dir() and _has_ct2_weights(path)):
        return load_ct2_whisper_model(model if model in ALIASES else str(path), dtype, device,
                                      attention_backend)
    if path.is_dir() and (path / "config.json").exists():
        return load_hf_directory(path, dtype, device, attention_backend)
    raise ValueError(f"model {model!r} is not a local Hugging Face checkpoint directory "
                     "(config.json + weights), a directory with a CTranslate2 Whisper model.bin, "
                     f"or one of the bundled Whisper models {list(ALIASES)}")


def _has_ct2_weights(path: Path) -> bool:
    return (path / "model.bin").is_file() or (path / "model.bin.part1").is_file()
