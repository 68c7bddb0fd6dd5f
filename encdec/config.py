"""Engine configuration: what model, how big the cache, how the scheduler batches, which device."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from encdec.checks import is_number, number

_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: Any) -> torch.dtype:
    """`dtype` (a name, "auto", None or a torch.dtype) as one of the torch dtypes encdec runs."""
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}")


class SpecialTokens(Protocol):
    """The special-token ids the engine reads. Each model family resolves its own record once,
    when the model loads (`encdec.models.registry`): `TextTokens` for BART-style models,
    `WhisperTokens` (which also holds Whisper's language, task and timestamp tokens)."""

    @property
    def decoder_start_token_id(self) -> int:
        """<DEC>: prepended to a decoder prompt that starts with none of the accepted tokens."""

    @property
    def eos_token_id(self) -> Optional[int]: ...

    @property
    def extra_decoder_start_token_ids(self) -> tuple[int, ...]:
        """Other tokens a decoder prompt may start with (Whisper's <|startofprev|>)."""


@dataclass
class ModelConfig:
    """The model, the limits its config implies, its special tokens and its KV cache's shape
    (per decoder layer: num_decoder_heads x head_size). `vocab_size` is the decoder's (output)
    vocabulary, `encoder_vocab_size` the encoder's: the same unless the model has a separate
    source vocabulary (Marian); None means the same."""

    model: str
    hf_config: Any
    dtype: torch.dtype
    max_encoder_len: int
    max_decoder_len: int
    vocab_size: int
    special_tokens: SpecialTokens
    num_decoder_layers: int
    num_decoder_heads: int
    head_size: int
    encoder_vocab_size: Optional[int] = None

    def __post_init__(self) -> None:
        if self.encoder_vocab_size is None:
            self.encoder_vocab_size = self.vocab_size

    def with_max_model_len(self, max_model_len: Optional[int], speech: bool) -> ModelConfig:
        """This config with the decoder's positions cut to `max_model_len` (vLLM's option: the
        decoder prompt and new tokens of a request; the encoder keeps its own); None keeps the
        model's. A speech model keeps its own: its windows' prompts and lengths are made for it."""
        max_model_len = number("max_model_len", max_model_len, 1, integer=True, none=True)
        if max_model_len is None or max_model_len == self.max_decoder_len:
            return self
        if speech or max_model_len > self.max_decoder_len:
            allowed = "only" if speech else "at most"
            raise ValueError(f"max_model_len={max_model_len}: {self.model} takes {allowed} its "
                             f"{self.max_decoder_len} decoder positions")
        return dataclasses.replace(self, max_decoder_len=max_model_len)

    @property
    def decoder_start_token_id(self) -> int:
        return self.special_tokens.decoder_start_token_id

    @property
    def eos_token_id(self) -> Optional[int]:
        return self.special_tokens.eos_token_id


@dataclass
class CacheConfig:
    """Paged KV cache: block size, and either a block count or a memory budget (GiB)."""

    block_size: int = 16
    num_gpu_blocks: Optional[int] = None
    kv_cache_space: float = 4.0
    swap_space: float = 4.0
    watermark: float = 0.01

    def __post_init__(self) -> None:
        self.block_size = number("block_size", self.block_size, 1, integer=True)
        self.num_gpu_blocks = number("num_gpu_blocks", self.num_gpu_blocks, 1, integer=True, none=True)
        self.kv_cache_space = number("kv_cache_space", self.kv_cache_space, 0, math.inf, above=True, below=True)
        self.swap_space = number("swap_space", self.swap_space, 0, math.inf, below=True)
        self.watermark = number("watermark", self.watermark, 0, 1, below=True)


@dataclass
class SchedulerConfig:
    """Batching budgets and the preemption mode ("swap" or "recompute").

    `max_running_requests` (SGLang's name) stops admitting waiting requests while that many
    run; the rest wait in arrival order. None: only the sequence and token budgets bound it.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    preemption_mode: Optional[str] = None
    max_running_requests: Optional[int] = None

    def __post_init__(self) -> None:
        self.max_num_seqs = number("max_num_seqs", self.max_num_seqs, 1, integer=True)
        if self.max_running_requests is not None:
            if not (is_number(self.max_running_requests, integer=True) and self.max_running_requests >= 1):
                raise ValueError(f"max_running_requests must be an integer >= 1, None or 'auto', "
                                 f"got {self.max_running_requests!r}")
            self.max_running_requests = int(self.max_running_requests)
        self.max_num_batched_tokens = number("max_num_batched_tokens", self.max_num_batched_tokens, 1,
                                             integer=True)
        if self.preemption_mode not in (None, "swap", "recompute"):
            raise ValueError(f"preemption_mode must be 'swap' or 'recompute', got {self.preemption_mode!r}")

    def check_num_seqs(self, count: int, asked: str) -> None:
        """Refuse `asked`, which runs `count` sequences at once, beyond `max_num_seqs`."""
        if count > self.max_num_seqs:
            raise ValueError(f"{asked} is more than the engine runs at once (max_num_seqs={self.max_num_seqs})")


SPEECH_RUNNING_REQUESTS_ON_CPU = 16  # benchmarks/RESULTS.md, "Fewer Whisper requests at once"


def auto_running_requests(speech: bool, device: torch.device) -> Optional[int]:
    """`max_running_requests="auto"`: 16 for a speech model on the CPU, else no limit. There each
    request's prefill is a 30 s encoder window, most of the work, so decoding more requests at
    once adds little throughput while every window admitted stalls all running ones: beyond
    that, requests wait their turn instead."""
    return SPEECH_RUNNING_REQUESTS_ON_CPU if speech and device.type == "cpu" else None


@dataclass
class DeviceConfig:
    device: torch.device

    @classmethod
    def create(cls, device: Optional[str]) -> "DeviceConfig":
        if device is None or (isinstance(device, str) and device == "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            dev = None
        if dev is None or dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' (or 'cuda:N') or 'auto', got {device!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was requested but CUDA is not available on this machine")
        return cls(dev)
