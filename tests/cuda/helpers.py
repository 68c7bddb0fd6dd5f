"""Shared by the CUDA tests: the backends to run on cuda, and which one an engine runs."""
from __future__ import annotations

import importlib.util

import pytest

HAS_XFORMERS = importlib.util.find_spec("xformers") is not None

# Every engine-level CUDA test runs with both attention backends (xformers when installed).
BACKENDS = [
    pytest.param("xformers", marks=pytest.mark.skipif(not HAS_XFORMERS,
                                                      reason="xformers not installed")),
    "torch",
]


def backend_name(llm) -> str:
    """The name of the attention backend an engine's model runs."""
    model = llm.llm_engine.model_runner.model
    return next(m.backend.name for m in model.modules() if hasattr(m, "backend"))
