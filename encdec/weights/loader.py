"""Resolve a model name or directory into a ready model, its config, tokenizer and input hooks.

Model-agnostic: the model registry (`encdec.models.registry`) supplies each family's model
class, special tokens, default decoder prompt, audio processor and CTranslate2 name mapping.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from encdec.attention.selector import get_attn_backend
from encdec.config import ModelConfig
from encdec.kernels.cpu_linear import WidenedLinear, packed_linear_for
from encdec.models.layers import pack_linears
from encdec.models.quantization import (check_quantization, float32_output_projection,
                                       quantize_model, widen_convolutions)
from encdec.models.registry import InputHooks, get_ct2_converter, get_model_family
from encdec.models.vocab_padding import pad_lm_head, pads_lm_head
from encdec.weights import PathLike
from encdec.weights.ct2 import ct2_tensors, open_ct2_model
from encdec.weights.tokenizer_file import TokenizerFile
from encdec.weights.whisper_assets import (ALIASES, WhisperAssets, assets_from_parts,
                                           resolve_whisper_model)
from encdec.whisper.tokens import is_multilingual

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    model_config: ModelConfig
    tokenizer: Any
    default_decoder_prompt: list[int]
    audio_processor: Optional[Callable[[Any], tuple[Any, int]]] = None


def build_model(model_cls: type, hf_config: Any, weights: Iterable[tuple[str, torch.Tensor]],
                dtype: torch.dtype, device: torch.device, attention_backend: Optional[str],
                quantization: Optional[str] = None) -> torch.nn.Module:
    with torch.device("meta"), _SkipInitFills():  # every tensor comes from the checkpoint
        model = model_cls(hf_config, get_attn_backend(device, attention_backend))
    allocate_empty(model)
    model.load_weights(weights)
    model = model.to(device=device, dtype=dtype).eval()
    if quantization is not None:
        quantize_model(model, quantization)
    if dtype == torch.bfloat16 and device.type == "cpu":
        float32_output_projection(model)
    if pads_lm_head(device, dtype):
        pad_lm_head(model)
    linear_cls = packed_linear_for(device, dtype)
    if linear_cls is not None:
        pack_linears(model, linear_cls)
    if linear_cls is WidenedLinear:  # bfloat16 on a processor without bfloat16 arithmetic
        widen_convolutions(model)
    return model


class _SkipInitFills(TorchFunctionMode):
    """Skip the random fills of modules' `reset_parameters` while a model is built on the meta
    device: there they run through torch's Python decompositions (about 0.1 s of Whisper tiny's
    start-up), and the checkpoint overwrites every value. A mode, unlike patching `torch.nn.init`,
    affects only the thread that builds the model."""

    FILLS = frozenset({torch.nn.init.kaiming_uniform_, torch.nn.init.uniform_,
                       torch.nn.init.normal_, torch.Tensor.uniform_, torch.Tensor.normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FILLS:  # the tensor it would fill, unchanged
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def allocate_empty(model: torch.nn.Module) -> None:
    """Give each meta parameter and buffer of `model` uninitialized CPU memory, as
    `model.to_empty(device="cpu")` does; its `empty_like` of a meta tensor would import torch's
    symbolic shapes and sympy (about half a second of start-up)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype),
                                                     requires_grad=param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buffer.shape, dtype=buffer.dtype))


def load_checkpoint(name: str, hf_config: Any, weights: Iterable[tuple[str, torch.Tensor]],
                    tokenizer: Any, generation_config: Optional[dict], dtype: torch.dtype,
                    device: torch.device, attention_backend: Optional[str],
                    quantization: Optional[str] = None) -> LoadedModel:
    """The model, its family's input hooks, its KV cache shape, and the length limits
    (`max_lengths`)."""
    family = get_model_family(hf_config)
    model = build_model(family.get_model_class(), hf_config, weights, dtype, device,
                        attention_backend, quantization)
    hooks = family.get_input_hooks(hf_config, tokenizer, generation_config)
    max_encoder, max_decoder = max_lengths(hf_config, hooks)
    num_layers, num_heads, head_size = model.kv_cache_shape
    vocab_size = getattr(hf_config, "decoder_vocab_size", None) or hf_config.vocab_size
    model_config = ModelConfig(
        model=name, hf_config=hf_config, dtype=dtype, max_encoder_len=max_encoder,
        max_decoder_len=max_decoder, vocab_size=vocab_size, special_tokens=hooks.special_tokens,
        num_decoder_layers=num_layers, num_decoder_heads=num_heads, head_size=head_size,
        encoder_vocab_size=hf_config.vocab_size)
    return LoadedModel(model, model_config, tokenizer, hooks.default_decoder_prompt,
                       hooks.audio_processor)


def max_lengths(hf_config: Any, hooks: InputHooks) -> tuple[int, int]:
    """The encoder's and the decoder's positions: the family's (T5), else one per side
    (max_source_positions / max_target_positions) or one for both (max_position_embeddings)
    from the config."""
    return hooks.max_lengths or (
        getattr(hf_config, "max_source_positions", None) or hf_config.max_position_embeddings,
        getattr(hf_config, "max_target_positions", None) or hf_config.max_position_embeddings)


def load_hf_directory(path: Path, dtype: torch.dtype, device: torch.device,
                      attention_backend: Optional[str],
                      quantization: Optional[str] = None) -> LoadedModel:
    """A local Hugging Face checkpoint directory: config.json, weights, tokenizer files and
    generation_config.json (read by the family's input hooks)."""
    from transformers import AutoConfig, AutoTokenizer

    from encdec.weights.hf import iterate_weights

    hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    tokenizer = None
    if has_tokenizer(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return load_checkpoint(str(path), hf_config, iterate_weights(path), tokenizer,
                           _read_json(path / "generation_config.json"), dtype, device,
                           attention_backend, quantization)


def load_ct2_checkpoint(source: PathLike | Sequence[PathLike] | WhisperAssets,
                        dtype: torch.dtype = torch.float32) -> tuple[dict, dict[str, torch.Tensor]]:
    """A CTranslate2 model as ``(Hugging Face config kwargs, Hugging Face state dict)``, mapped
    by the family that reads its spec.

    ``source`` is a bundled model's alias (``"tiny.en"``, ``"base"``), a model directory, a
    ``model.bin`` path, a list of its parts, or resolved assets. Raises ``ValueError`` if the
    file holds variables the mapping does not know.
    """
    if isinstance(source, WhisperAssets):
        assets = source
    elif isinstance(source, (str, os.PathLike)):
        assets = resolve_whisper_model(source)
    else:
        assets = assets_from_parts(source)
    model = open_ct2_model(assets.bin_parts)
    to_hf = get_ct2_converter(model.spec_name)
    tensors = ct2_tensors(model, dtype=dtype)
    aliases = model.aliases
    del model  # drop the raw bytes before building the state dict
    conversion = to_hf(tensors, aliases, ct2_config=_read_json(assets.config_json),
                       tokenizer=_read_json(assets.tokenizer_json))
    if conversion.report.unused:
        raise ValueError(f"{assets.name}: unknown CTranslate2 variables {sorted(conversion.report.unused)}")
    logger.debug("loaded %s: %d HF tensors", assets.name, len(conversion.state_dict))
    return conversion.config, conversion.state_dict


def load_ct2_directory(name: str, dtype: torch.dtype, device: torch.device,
                       attention_backend: Optional[str],
                       quantization: Optional[str] = None) -> LoadedModel:
    """A CTranslate2 model (a bundled one's alias, or a directory with model.bin or its parts):
    weights mapped to Hugging Face names, the tokenizer from its tokenizer.json; the converted
    config (suppress lists, language ids included) serves as its generation config.

    Neither the config nor the tokenizer goes through transformers, whose import would take
    about a second of `encdec transcribe`'s start-up: the config is a namespace of the converted
    fields (every field the model and its hooks read), the tokenizer a `TokenizerFile`."""
    assets = resolve_whisper_model(name)
    if assets.tokenizer_json is None:
        raise ValueError(f"{assets.name}: no tokenizer.json beside model.bin")
    config, state = load_ct2_checkpoint(assets)
    hf_config = SimpleNamespace(**config)
    hf_config.model_type = get_model_family(hf_config).model_type
    tokenizer = TokenizerFile(assets.tokenizer_json)
    return load_checkpoint(assets.name, hf_config, state.items(), tokenizer, config, dtype,
                           device, attention_backend, quantization)


def load_model(model: str, dtype: torch.dtype, device: torch.device,
               attention_backend: Optional[str] = None,
               quantization: Optional[str] = None) -> LoadedModel:
    """A local Hugging Face checkpoint directory, or a CTranslate2 model: an alias of a bundled
    one ("tiny.en", "base") or a directory holding model.bin (or its parts). `quantization`
    ("int8" or None) is applied once the weights are loaded (`encdec.models.quantization`)."""
    check_model(model)
    check_quantization(quantization, dtype, device)
    path = Path(model).expanduser()
    if model in ALIASES or _has_ct2_weights(path):
        return load_ct2_directory(model if model in ALIASES else str(path), dtype, device,
                                  attention_backend, quantization)
    return load_hf_directory(path, dtype, device, attention_backend, quantization)


def check_model(model: str, field: str = "model") -> None:
    """Raise a ValueError naming `field` unless `model` is a bundled Whisper model that is
    installed or a checkpoint directory `load_model` reads; reads no weights."""
    if model in ALIASES:
        resolve_whisper_model(model)
        return
    problem = checkpoint_dir_problem(Path(model).expanduser())
    if problem:
        raise ValueError(f"{field} {model!r} is neither a bundled Whisper model "
                         f"({', '.join(ALIASES)}) nor a local checkpoint directory: {problem}")


def checkpoint_dir_problem(path: Path) -> Optional[str]:
    """Why `path` is not a checkpoint directory (Hugging Face config.json and weights, or a
    CTranslate2 model.bin); None if it is one."""
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "not a directory"
    if not ((path / "config.json").is_file() or _has_ct2_weights(path)):
        return "no config.json in the directory"
    return None


def has_tokenizer(path: Path) -> bool:
    """Whether the Hugging Face checkpoint directory `path` has tokenizer files (without them
    the model takes token ids only)."""
    return any((path / f).exists() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json",
                                             "spiece.model", "sentencepiece.bpe.model"))


def is_whisper(model: str) -> bool:
    """Whether `model` is a Whisper model (a bundled one, a CTranslate2 directory, or a Hugging
    Face directory whose config.json says so), told without reading its weights."""
    path = Path(model).expanduser()
    if model in ALIASES or _has_ct2_weights(path):
        return True
    try:
        config = _read_json(path / "config.json") or {}
    except ValueError:  # not JSON: loading the model says so
        return False
    return config.get("model_type") == "whisper"


def decoder_positions(model: str) -> int:
    """The decoder's positions of the Hugging Face text checkpoint directory `model`, as
    `load_checkpoint` finds them, from its config files alone (ValueError for a family encdec
    does not run)."""
    from transformers import AutoConfig

    path = Path(model).expanduser()
    hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    family = get_model_family(hf_config)
    hooks = family.get_input_hooks(hf_config, None, _read_json(path / "generation_config.json"))
    return max_lengths(hf_config, hooks)[1]


def _has_ct2_weights(path: Path) -> bool:
    return (path / "model.bin").is_file() or (path / "model.bin.part1").is_file()


def whisper_multilingual(model: str, field: str = "model") -> Optional[bool]:
    """Whether the Whisper `model` (a bundled alias or a checkpoint directory) is multilingual,
    told from its side files without reading its weights, by the rule its loaded special tokens
    follow (`is_multilingual`); None when they do not tell. A checkpoint of another
    family is a ValueError naming `field`."""
    path = Path(model).expanduser()
    if model in ALIASES or _has_ct2_weights(path):
        vocabulary = resolve_whisper_model(model if model in ALIASES else path).vocabulary
        if vocabulary is None:
            return None
        text = vocabulary.read_text(encoding="utf-8")
        # (a token a line; not `splitlines`, which also cuts at characters such as U+2028)
        size = len(json.loads(text)) if vocabulary.suffix == ".json" else text.rstrip("\n").count("\n") + 1
        return is_multilingual(size)
    config = _read_json(path / "config.json") or {}
    if config.get("model_type", "whisper") != "whisper":
        raise ValueError(f"{field} {model}: not a Whisper model (its config.json says model_type "
                         f"{config['model_type']!r})")
    generation = _read_json(path / "generation_config.json") or {}
    if config.get("vocab_size") is None and "is_multilingual" not in generation:
        return None
    return is_multilingual(config.get("vocab_size") or 0, generation)


def _read_json(path: Optional[Path]) -> Optional[dict]:
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, or not UTF-8
        raise ValueError(f"{path.name} is not valid JSON: {err}") from None
