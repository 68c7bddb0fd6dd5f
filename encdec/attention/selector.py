"""Picks the attention backend: xformers on CUDA when importable, torch SDPA otherwise.

`ENCDEC_ATTENTION_BACKEND` (environment) or the engine's `attention_backend` argument override
the choice ("torch" or "xformers"); xformers without CUDA is refused with a clear error.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch

from encdec.attention.backends.abstract import AttentionBackend

ENV_VAR = "ENCDEC_ATTENTION_BACKEND"
_NAMES = ("torch", "xformers")


def select_backend_name(device: torch.device, requested: Optional[str] = None) -> str:
    name = requested or os.environ.get(ENV_VAR) or None
    if name is None:
        has_xformers = importlib.util.find_spec("xformers") is not None
        return "xformers" if device.type == "cuda" and has_xformers else "torch"
    if name not in _NAMES:
        raise ValueError(f"attention backend must be one of {_NAMES}, got {name!r}")
    if name == "xformers" and device.type != "cuda":
        raise ValueError(f"the xformers attention backend needs a CUDA device, but the engine "
                         f"runs on {device.type!r}; use attention_backend='torch'")
    if name == "xformers" and importlib.util.find_spec("xformers") is None:
        raise ValueError("the xformers attention backend was requested but xformers is not "
                         "installed (pip install 'encdec[xformers]')")
    return name


def get_attn_backend(device: torch.device, requested: Optional[str] = None) -> AttentionBackend:
    name = select_backend_name(device, requested)
    if name == "xformers":
        from encdec.attention.backends.xformers import XFormersBackend
        return XFormersBackend()
    from encdec.attention.backends.torch_sdpa import TorchSDPABackend
    return TorchSDPABackend()
