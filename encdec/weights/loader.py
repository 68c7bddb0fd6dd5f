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
    model = model_cls(hf_config, get_attn_backend(device, attention_backend))
    model.load_weights(weights)
    return model.to(device=device, dtype=dtype).eval()


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


def with_whisper_hooks(loaded: LoadedModel, generation_config: Optional[dict] = None) -> LoadedModel:
    """Whisper: <|startoftranscript|> / <|endoftext|> as start / end, the control-token prefix
    as the default decoder prompt, and log-mel features for audio prompts."""
    from encdec.whisper import whisper_input_hooks

    hooks = whisper_input_hooks(loaded.model_config.hf_config, loaded.tokenizer, generation_config)
    model_config = dataclasses.replace(loaded.model_config, decoder_start_token_id=hooks.tokens.sot,
                                       eos_token_id=hooks.tokens.eot)
    return dataclasses.replace(loaded, model_config=model_config,
                               default_decoder_prompt=hooks.default_decoder_prompt,
                               audio_processor=hooks.audio_processor)


def load_model(model: str, dtype: torch.dtype, device: torch.device,
               attention_backend: Optional[str] = None) -> LoadedModel:
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").exists() and not (path / "model.bin").exists():
        return load_hf_directory(path, dtype, device, attention_backend)
    raise ValueError(f"model {model!r} is not a local Hugging Face checkpoint directory "
                     "(config.json + weights)")
