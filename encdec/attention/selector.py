"""Picks the attention backend: xformers on CUDA when its kernels run, torch SDPA otherwise.

`ENCDEC_ATTENTION_BACKEND` (environment) or the engine's `attention_backend` argument override
the choice ("torch" or "xformers"); xformers without CUDA is refused with a clear error. An
xformers wheel built for another torch or CUDA version imports but cannot run its kernels
("xFormers wasn't build with CUDA support"): one tiny attention call finds that out, and the
torch backend is chosen instead, with a warning.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
from typing import Optional

import torch

from encdec.attention.backends.abstract import AttentionBackend

ENV_VAR = "ENCDEC_ATTENTION_BACKEND"
_NAMES = ("torch", "xformers")


logger = logging.getLogger(__name__)


def select_backend_name(device: torch.device, requested: Optional[str] = None) -> str:
    name = requested or os.environ.get(ENV_VAR) or None
    if name is None:
        if device.type != "cuda" or importlib.util.find_spec("xformers") is None:
            return "torch"
        failure = xformers_failure(device)
        if failure:
            logger.warning("xformers cannot run on %s (%s); using the torch attention backend",
                           device, failure)
        return "torch" if failure else "xformers"
    if name not in _NAMES:
        raise ValueError(f"attention backend must be one of {_NAMES}, got {name!r}")
    if name == "xformers" and device.type != "cuda":
        raise ValueError(f"the xformers attention backend needs a CUDA device, but the engine "
                         f"runs on {device.type!r}; use attention_backend='torch'")
    if name == "xformers" and importlib.util.find_spec("xformers") is None:
        raise ValueError("the xformers attention backend was requested but xformers is not "
                         "installed (pip install xformers)")
    if name == "xformers" and xformers_failure(device):
        raise ValueError(f"the xformers attention backend was requested but its kernels do not "
                         f"run on {device}: {xformers_failure(device)}")
    return name


@functools.lru_cache(maxsize=None)
def xformers_failure(device: torch.device) -> str:
    """Why xformers' attention kernel fails on `device` ("" when it runs)."""
    try:
        from xformers.ops import memory_efficient_attention

        q = torch.zeros(1, 2, 1, 8, device=device, dtype=torch.float16)
        memory_efficient_attention(q, q, q)
    except Exception as err:  # any failure means: do not use it
        if "wasn't build with CUDA support" in str(err):
            return ("its C++/CUDA extensions did not load: the wheel was built for another torch "
                    "or CUDA version (`python -m xformers.info` says which)")
        return f"{type(err).__name__}: {err}".split("\n")[0]
    return ""


def get_attn_backend(device: torch.device, requested: Optional[str] = None) -> AttentionBackend:
    name = select_backend_name(device, requested)
    if name == "xformers":
        from encdec.attention.backends.xformers import XFormersBackend
        return XFormersBackend()
    from encdec.attention.backends.torch_sdpa import TorchSDPABackend
    return TorchSDPABackend()
