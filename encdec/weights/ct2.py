"""Read CTranslate2 ``model.bin`` files and convert Whisper ones to Hugging Face names.

See ``/work/shared/notes/whisper-ct2.md`` for the format and the name mapping.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Mapping, NamedTuple, Sequence, Union

import numpy as np
import torch

from encdec.weights.whisper_assets import WhisperAssets, assets_from_parts, resolve_whisper_model

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]
MAX_BINARY_VERSION = 6

# dtype ids of binary version >= 4; "bfloat16" has no numpy dtype and is widened by hand.
_DTYPE_IDS = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
# binary versions < 4 store an item size instead of a dtype id.
_ITEM_SIZES = {4: "float32", 2: "int16", 1: "int8"}
_ITEM_BYTES = {"float32": 4, "int8": 1, "int16": 2, "int32": 4, "float16": 2, "bfloat16": 2}


# --------------------------------------------------------------------------- streams


class ChainedFiles:
    """Read-only stream over several files read back to back (e.g. a model split in parts)."""

    def __init__(self, paths: Iterable[PathLike]):
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("ChainedFiles needs at least one file")
        for path in self.paths:
            if not path.is_file():
                raise FileNotFoundError(f"file not found: {path}")
        self._index = 0
        self._file: BinaryIO | None = open(self.paths[0], "rb")
        self._position = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the current file onwards; returns the bytes read (0 at the end)."""
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._file is not None:
            n = self._file.readinto(view[filled:])
            if n:
                filled += n
            else:
                self._next_file()
        self._position += filled
        return filled

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while self._file is not None:
                chunks.append(self._file.read())
                self._next_file()
            data = b"".join(chunks)
            self._position += len(data)
            return data
        buffer = bytearray(size)
        return bytes(buffer[: self.readinto(buffer)])

    def _next_file(self) -> None:
        self._file.close()
        self._index += 1
        self._file = open(self.paths[self._index], "rb") if self._index < len(self.paths) else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._index = len(self.paths)

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> "ChainedFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- model.bin


@dataclass
class CT2Variable:
    """One stored variable: C-order ``shape`` and raw little-endian ``data`` of ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: bytearray

    def numpy(self) -> np.ndarray:
        """The stored values (bfloat16 is widened to float32)."""
        if self.dtype == "bfloat16":
            bits = np.frombuffer(self.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(self.shape)
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(self.shape)


@dataclass
class CT2Model:
    """Parsed ``model.bin``: header, variables by name and ``alias -> target`` names."""

    binary_version: int
    spec_name: str | None
    spec_revision: int | None
    variables: dict[str, CT2Variable] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)


def _read_exact(stream: BinaryIO, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    while filled < size:
        n = stream.readinto(view[filled:])
        if not n:
            raise ValueError(f"truncated CTranslate2 model: wanted {size} bytes, got {filled}")
        filled += n
    return buffer


def _unpack(stream: BinaryIO, fmt: str):
    return struct.unpack("<" + fmt, _read_exact(stream, struct.calcsize("<" + fmt)))[0]


def _read_string(stream: BinaryIO) -> str:
    length = _unpack(stream, "H")
    raw = _read_exact(stream, length)
    if length == 0 or raw[-1] != 0:
        raise ValueError("malformed CTranslate2 model: string without its trailing NUL")
    return raw[:-1].decode("utf-8")


def read_ct2_model(stream: BinaryIO) -> CT2Model:
    """Parse a CTranslate2 ``model.bin`` (binary versions 1 to 6) from a binary stream."""
    version = _unpack(stream, "I")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise ValueError(
            f"unsupported CTranslate2 binary version {version} (supported: 1-{MAX_BINARY_VERSION})"
        )
    model = CT2Model(version, None, None)
    if version >= 2:
        model.spec_name = _read_string(stream)
        model.spec_revision = _unpack(stream, "I")
    for _ in range(_unpack(stream, "I")):
        name = _read_string(stream)
        shape = tuple(_unpack(stream, "I") for _ in range(_unpack(stream, "B")))
        if version >= 4:
            type_id = _unpack(stream, "B")
            if type_id not in _DTYPE_IDS:
                raise ValueError(f"{name}: unknown CTranslate2 dtype id {type_id}")
            dtype, num_bytes = _DTYPE_IDS[type_id], _unpack(stream, "I")
        else:
            item_size = _unpack(stream, "B")
            if item_size not in _ITEM_SIZES:
                raise ValueError(f"{name}: unsupported item size {item_size}")
            dtype, num_bytes = _ITEM_SIZES[item_size], item_size * _unpack(stream, "I")
        if num_bytes != _ITEM_BYTES[dtype] * int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{name}: {num_bytes} bytes do not match shape {shape} of {dtype}")
        model.variables[name] = CT2Variable(name, shape, dtype, _read_exact(stream, num_bytes))
    if version >= 3:
        for _ in range(_unpack(stream, "I")):
            alias = _read_string(stream)
            model.aliases[alias] = _read_string(stream)
    return model


def open_ct2_model(paths: PathLike | Sequence[PathLike]) -> CT2Model:
    """Read ``model.bin`` from a path, or from several parts read as one stream."""
    parts = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    with ChainedFiles(parts) as stream:
        return read_ct2_model(stream)


def ct2_tensors(model: CT2Model, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Variables as tensors: floats cast to ``dtype``, int8/int16 weights dequantised with
    their ``<name>_scale`` (``float = q / scale``, one scale per output row or per tensor).
    Scale variables are folded in and not returned; integer scalars keep an integer dtype."""
    quantized = {
        name
        for name, var in model.variables.items()
        if var.dtype in ("int8", "int16") and name + "_scale" in model.variables
    }
    scales = {n + "_scale" for n in quantized}
    tensors = {}
    for name, var in model.variables.items():
        if name in scales:
            continue
        values = var.numpy()
        if name in quantized:
            scale = model.variables[name + "_scale"].numpy().astype(np.float32)
            if scale.size > 1:
                scale = scale.reshape((-1,) + (1,) * (values.ndim - 1))
            tensors[name] = torch.from_numpy(values.astype(np.float32) / scale).to(dtype)
        elif np.issubdtype(values.dtype, np.floating):
            tensors[name] = torch.from_numpy(values.astype(np.float32, copy=False)).to(dtype)
        else:
            tensors[name] = torch.from_numpy(values.copy())
    return tensors


# --------------------------------------------------------------------------- Whisper -> HF

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


def _copy_linear(src: _Variables, out: dict, ct2: str, hf: str, bias: bool = True) -> None:
    out[f"{hf}.weight"] = src.get(f"{ct2}/weight")
    if bias:
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
        _split_linear(src, out, f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", _QKV, d)
        _copy_linear(src, out, f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        _copy_norm(src, out, f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        _convert_ffn(src, out, ct2, hf)
    _copy_norm(src, out, "encoder/layer_norm", "model.encoder.layer_norm")


def _convert_decoder(src: _Variables, out: dict, layers: int, d: int) -> None:
    out["model.decoder.embed_tokens.weight"] = src.get("decoder/embeddings/weight")
    out["model.decoder.embed_positions.weight"] = src.get("decoder/position_encodings/encodings")
    for i in range(layers):
        ct2, hf = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _split_linear(src, out, f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", _QKV, d)
        _copy_linear(src, out, f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        _copy_norm(src, out, f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        _copy_linear(src, out, f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        _split_linear(src, out, f"{ct2}/attention/linear_1", f"{hf}.encoder_attn", ("k_proj", "v_proj"), d)
        _copy_linear(src, out, f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
        _copy_norm(src, out, f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        _convert_ffn(src, out, ct2, hf)
    _copy_norm(src, out, "decoder/layer_norm", "model.decoder.layer_norm")


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


def whisper_token_config(tokenizer: Mapping) -> dict:
    """Special-token ids from a parsed ``tokenizer.json`` (its ``added_tokens``)."""
    ids = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}
    missing = [t for t in ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>") if t not in ids]
    if missing:
        raise ValueError(f"tokenizer.json lacks the Whisper special tokens {missing}")
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    no_timestamps = ids["<|notimestamps|>"]
    tasks = {task: ids[f"<|{task}|>"] for task in ("transcribe", "translate") if f"<|{task}|>" in ids}
    first_task = min(tasks.values(), default=no_timestamps)
    config = {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "no_timestamps_token_id": no_timestamps,
        "timestamp_begin": no_timestamps + 1,
        "task_to_id": tasks,
        "lang_to_id": {tok: i for tok, i in ids.items() if sot < i < first_task},
    }
    if "<|startofprev|>" in ids:
        config["prev_sot_token_id"] = ids["<|startofprev|>"]
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
    """Map CTranslate2 Whisper variables (from :func:`ct2_tensors`) to a Hugging Face
    ``WhisperForConditionalGeneration`` state dict and ``WhisperConfig`` keyword arguments.

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
        config.update(whisper_token_config(tokenizer))
        config["is_multilingual"] = config["vocab_size"] >= 51865
    if ct2_config is not None:
        config.update(_generation_config(ct2_config))
    ignored = {name for name in _IGNORED_SCALARS if name in src}
    every = set(variables) | set(aliases)
    report = ConversionReport(used=src.used & every, ignored=ignored, unused=every - src.used - ignored)
    return WhisperConversion(config, state, report)


# --------------------------------------------------------------------------- loading


def _read_json(path: Path | None) -> dict | None:
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_ct2_whisper(
    source: PathLike | Sequence[PathLike] | WhisperAssets, dtype: torch.dtype = torch.float32
) -> tuple[dict, dict[str, torch.Tensor]]:
    """Load a CTranslate2 Whisper model as ``(WhisperConfig kwargs, HF state dict)``.

    ``source`` is a model alias (``"tiny.en"``, ``"base"``), a model directory, a list of
    ``model.bin`` parts, or resolved :class:`WhisperAssets`. Raises ``ValueError`` if the
    file holds variables this converter does not know.
    """
    if isinstance(source, WhisperAssets):
        assets = source
    elif isinstance(source, (str, os.PathLike)):
        assets = resolve_whisper_model(source)
    else:
        assets = assets_from_parts(source)
    model = open_ct2_model(assets.bin_parts)
    if model.spec_name not in (None, "WhisperSpec"):
        raise ValueError(f"{assets.name}: expected a WhisperSpec model, got {model.spec_name}")
    tensors = ct2_tensors(model, dtype=dtype)
    aliases = model.aliases
    del model  # drop the raw bytes before building the state dict
    conversion = ct2_whisper_to_hf(
        tensors,
        aliases,
        ct2_config=_read_json(assets.config_json),
        tokenizer=_read_json(assets.tokenizer_json),
    )
    if conversion.report.unused:
        raise ValueError(f"{assets.name}: unknown CTranslate2 variables {sorted(conversion.report.unused)}")
    logger.debug("loaded %s: %d HF tensors", assets.name, len(conversion.state_dict))
    return conversion.config, conversion.state_dict
