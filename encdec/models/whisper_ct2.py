"""Whisper's CTranslate2 variable names -> Hugging Face `WhisperForConditionalGeneration` names.

CTranslate2 fuses the self-attention q/k/v (and the cross-attention k/v) projections and keeps
no key bias; layer norms are gamma/beta; the output projection is an alias of the token
embeddings when tied. The architecture is read from the variables' shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple, Sequence

import torch

from encdec.whisper.tokens import whisper_tokens_from_vocab

_GELU = 3
_QKV = ("q_proj", "k_proj", "v_proj")
_IGNORED_SCALARS = (
    "decoder/alignment_layer",
    "decoder/alignment_heads",
    "decoder/alibi",
    "decoder/alibi_use_positive_positions",
    "decoder/scale_alibi",
    "decoder/start_from_zero_embedding",
)


@dataclass
class ConversionReport:
    """Which CTranslate2 variables the conversion used, ignored, or did not know."""

    used: set[str]
    ignored: set[str]
    unused: set[str]


class WhisperConversion(NamedTuple):
    config: dict
    state_dict: dict[str, torch.Tensor]
    report: ConversionReport


class _Variables:
    """Name lookup that resolves aliases and records every name it hands out."""

    def __init__(self, variables: Mapping[str, torch.Tensor], aliases: Mapping[str, str]):
        self.variables, self.aliases = variables, dict(aliases)
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.variables or name in self.aliases

    def get(self, name: str) -> torch.Tensor:
        self.used.add(name)
        target = self.aliases.get(name, name)
        if target not in self.variables:
            raise ValueError(f"CTranslate2 Whisper model has no variable {name!r}")
        self.used.add(target)
        return self.variables[target]

    def scalar(self, name: str) -> int:
        return int(self.get(name).item())

    def is_alias_of(self, name: str, target: str) -> bool:
        return self.aliases.get(name) == target


def _copy_linear(src: _Variables, out: dict, ct2: str, hf: str) -> None:
    out[f"{hf}.weight"] = src.get(f"{ct2}/weight")
    out[f"{hf}.bias"] = src.get(f"{ct2}/bias")


def _copy_norm(src: _Variables, out: dict, ct2: str, hf: str) -> None:
    out[f"{hf}.weight"] = src.get(f"{ct2}/gamma")
    out[f"{hf}.bias"] = src.get(f"{ct2}/beta")


def _split_linear(src: _Variables, out: dict, ct2: str, hf_prefix: str, names: Sequence[str], d: int) -> None:
    """Split a fused ``[len(names) * d, d]`` linear; ``k_proj`` gets no bias (it must be zero)."""
    weight, bias = src.get(f"{ct2}/weight"), src.get(f"{ct2}/bias")
    if weight.shape[0] != len(names) * d or bias.shape[0] != len(names) * d:
        raise ValueError(f"{ct2}: expected {len(names) * d} fused rows, got {tuple(weight.shape)}")
    for i, name in enumerate(names):
        rows = slice(i * d, (i + 1) * d)
        out[f"{hf_prefix}.{name}.weight"] = weight[rows]
        if name == "k_proj":
            if torch.count_nonzero(bias[rows]):
                raise ValueError(f"{ct2}/bias: key bias is not zero; Hugging Face k_proj has no bias")
        else:
            out[f"{hf_prefix}.{name}.bias"] = bias[rows]


def _layer_count(names: Iterable[str], stack: str) -> int:
    pattern = re.compile(rf"{stack}/layer_(\d+)/")
    indices = {int(m.group(1)) for n in names if (m := pattern.match(n))}
    if indices != set(range(len(indices))):
        raise ValueError(f"{stack}: layer indices are not contiguous: {sorted(indices)}")
    return len(indices)


def _convert_encoder(src: _Variables, out: dict, layers: int, d: int) -> None:
    for conv in ("conv1", "conv2"):
        _copy_linear(src, out, f"encoder/{conv}", f"model.encoder.{conv}")
    out["model.encoder.embed_positions.weight"] = src.get("encoder/position_encodings/encodings")
    for i in range(layers):
        ct2, hf = f"encoder/layer_{i}", f"model.encoder.layers.{i}"
        _convert_self_attention(src, out, ct2, hf, d)
        _convert_ffn(src, out, ct2, hf)
    _copy_norm(src, out, "encoder/layer_norm", "model.encoder.layer_norm")


def _convert_decoder(src: _Variables, out: dict, layers: int, d: int) -> None:
    out["model.decoder.embed_tokens.weight"] = src.get("decoder/embeddings/weight")
    out["model.decoder.embed_positions.weight"] = src.get("decoder/position_encodings/encodings")
    for i in range(layers):
        ct2, hf = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _convert_self_attention(src, out, ct2, hf, d)
        _copy_linear(src, out, f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        _split_linear(src, out, f"{ct2}/attention/linear_1", f"{hf}.encoder_attn", ("k_proj", "v_proj"), d)
        _copy_linear(src, out, f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
        _copy_norm(src, out, f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        _convert_ffn(src, out, ct2, hf)
    _copy_norm(src, out, "decoder/layer_norm", "model.decoder.layer_norm")


def _convert_self_attention(src: _Variables, out: dict, ct2: str, hf: str, d: int) -> None:
    _split_linear(src, out, f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", _QKV, d)
    _copy_linear(src, out, f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
    _copy_norm(src, out, f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")


def _convert_ffn(src: _Variables, out: dict, ct2: str, hf: str) -> None:
    _copy_linear(src, out, f"{ct2}/ffn/linear_0", f"{hf}.fc1")
    _copy_linear(src, out, f"{ct2}/ffn/linear_1", f"{hf}.fc2")
    _copy_norm(src, out, f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")


def _convert_projection(src: _Variables, out: dict) -> bool:
    """Set ``proj_out.weight``; returns whether it is tied to the token embeddings."""
    if "decoder/projection/bias" in src and torch.count_nonzero(src.get("decoder/projection/bias")):
        raise ValueError("decoder/projection/bias is not zero; Hugging Face proj_out has no bias")
    tied = src.is_alias_of("decoder/projection/weight", "decoder/embeddings/weight")
    out["proj_out.weight"] = src.get("decoder/projection/weight")
    return tied


def _check_flags(src: _Variables) -> None:
    expected = {"decoder/activation": _GELU, "decoder/pre_norm": 1, "decoder/scale_embeddings": 0}
    for name, value in expected.items():
        if name in src and src.scalar(name) != value:
            raise ValueError(f"unsupported Whisper variant: {name} = {src.scalar(name)}, expected {value}")


def _architecture(src: _Variables, names: Iterable[str]) -> dict:
    names = list(names)
    shape = lambda name: tuple(src.get(name).shape)  # noqa: E731
    encoder_layers, decoder_layers = _layer_count(names, "encoder"), _layer_count(names, "decoder")
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "d_model": shape("encoder/layer_norm/gamma")[0],
        "num_mel_bins": shape("encoder/conv1/weight")[1],
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "encoder_attention_heads": src.scalar("encoder/num_heads"),
        "decoder_attention_heads": src.scalar("decoder/num_heads"),
        "encoder_ffn_dim": shape("encoder/layer_0/ffn/linear_0/weight")[0],
        "decoder_ffn_dim": shape("decoder/layer_0/ffn/linear_0/weight")[0],
        "vocab_size": shape("decoder/embeddings/weight")[0],
        "max_source_positions": shape("encoder/position_encodings/encodings")[0],
        "max_target_positions": shape("decoder/position_encodings/encodings")[0],
        "activation_function": "gelu",
        "scale_embedding": False,
    }


def _token_config(tokenizer: Mapping, vocab_size: int) -> dict:
    """WhisperConfig token fields for the special tokens of a parsed ``tokenizer.json``."""
    added = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}
    tokens = whisper_tokens_from_vocab(added, vocab_size)
    config = {
        "decoder_start_token_id": tokens.sot,
        "bos_token_id": tokens.eot,
        "eos_token_id": tokens.eot,
        "pad_token_id": tokens.eot,
        "no_timestamps_token_id": tokens.no_timestamps,
        "timestamp_begin": tokens.timestamp_begin,
        "task_to_id": tokens.task_to_id,
        "lang_to_id": {f"<|{lang}|>": i for lang, i in tokens.lang_to_id.items()},
        "is_multilingual": tokens.multilingual,
    }
    if tokens.sot_prev is not None:
        config["prev_sot_token_id"] = tokens.sot_prev
    return config


def _generation_config(ct2_config: Mapping) -> dict:
    renames = {
        "suppress_ids": "suppress_tokens",
        "suppress_ids_begin": "begin_suppress_tokens",
        "alignment_heads": "alignment_heads",
        "lang_ids": "lang_ids",
    }
    return {hf: ct2_config[ct2] for ct2, hf in renames.items() if ct2 in ct2_config}


def ct2_whisper_to_hf(
    variables: Mapping[str, torch.Tensor],
    aliases: Mapping[str, str],
    *,
    ct2_config: Mapping | None = None,
    tokenizer: Mapping | None = None,
) -> WhisperConversion:
    """Map CTranslate2 Whisper variables (from ``encdec.weights.ct2.ct2_tensors``) to a Hugging
    Face ``WhisperForConditionalGeneration`` state dict and ``WhisperConfig`` keyword arguments
    (with the generation fields Hugging Face's Whisper ``generate`` reads from its config).

    ``ct2_config`` is the parsed ``config.json`` beside ``model.bin`` and ``tokenizer`` the
    parsed ``tokenizer.json``; without them the token fields keep Hugging Face's defaults.
    """
    src = _Variables(variables, aliases)
    _check_flags(src)
    config = _architecture(src, list(variables) + list(aliases))
    d = config["d_model"]
    state: dict[str, torch.Tensor] = {}
    _convert_encoder(src, state, config["encoder_layers"], d)
    _convert_decoder(src, state, config["decoder_layers"], d)
    config["tie_word_embeddings"] = _convert_projection(src, state)
    if tokenizer is not None:
        config.update(_token_config(tokenizer, config["vocab_size"]))
    if ct2_config is not None:
        config.update(_generation_config(ct2_config))
    ignored = {name for name in _IGNORED_SCALARS if name in src}
    every = set(variables) | set(aliases)
    report = ConversionReport(used=src.used & every, ignored=ignored, unused=every - src.used - ignored)
    return WhisperConversion(config, state, report)
