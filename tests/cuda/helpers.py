"""Shared by the CUDA tests: the backends to run on cuda, and which one an engine runs."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from encdec.attention.selector import xformers_failure


def _xformers_skip_reason() -> str:
    """Why the xformers tests cannot run here ("" when they can). A wheel built for another
    torch or CUDA version imports but cannot run its kernels: the selector's probe says so."""
    if importlib.util.find_spec("xformers") is None:
        return "xformers not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    failure = xformers_failure(torch.device("cuda"))
    return f"xformers cannot run on this GPU ({failure})" if failure else ""


XFORMERS_SKIP = _xformers_skip_reason()

# Every engine-level CUDA test runs with both attention backends (xformers where it runs).
BACKENDS = [
    pytest.param("xformers", marks=pytest.mark.skipif(bool(XFORMERS_SKIP), reason=XFORMERS_SKIP)),
    "torch",
]


def backend_name(llm) -> str:
    """The name of the attention backend an engine's model runs."""
    model = llm.llm_engine.model_runner.model
    return next(m.backend.name for m in model.modules() if hasattr(m, "backend"))
