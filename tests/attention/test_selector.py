"""Backend selection: torch on CPU, xformers only on CUDA with xformers installed, clear errors.

These run with or without xformers installed; its presence is simulated through `find_spec`.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from encdec.attention import selector
from encdec.attention.backends.torch_sdpa import TorchSDPABackend

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(autouse=True)
def no_env_override(monkeypatch):
    monkeypatch.delenv(selector.ENV_VAR, raising=False)


def fake_xformers(monkeypatch, installed: bool, failure: str = "") -> None:
    """Make `find_spec("xformers")` report xformers as (not) installed, and its kernel probe
    fail with `failure` ("" : it runs)."""
    find_spec = selector.importlib.util.find_spec

    def fake(name, *args, **kwargs):
        if name == "xformers":
            return object() if installed else None
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(selector.importlib.util, "find_spec", fake)
    monkeypatch.setattr(selector, "xformers_failure", lambda device: failure)


@pytest.mark.parametrize("installed", [True, False])
def test_cpu_defaults_to_torch(monkeypatch, installed):
    fake_xformers(monkeypatch, installed)
    assert selector.select_backend_name(CPU) == "torch"
    backend = selector.get_attn_backend(CPU)
    assert isinstance(backend, TorchSDPABackend) and backend.name == "torch"


def test_empty_env_var_means_default(monkeypatch):
    monkeypatch.setenv(selector.ENV_VAR, "")
    assert selector.select_backend_name(CPU) == "torch"


def test_torch_by_env_var_and_by_argument(monkeypatch):
    assert selector.select_backend_name(CPU, "torch") == "torch"
    monkeypatch.setenv(selector.ENV_VAR, "torch")
    assert selector.select_backend_name(CPU) == "torch"
    assert isinstance(selector.get_attn_backend(CPU), TorchSDPABackend)


def test_argument_overrides_env_var(monkeypatch):
    monkeypatch.setenv(selector.ENV_VAR, "xformers")
    assert selector.select_backend_name(CPU, "torch") == "torch"


@pytest.mark.parametrize("installed", [True, False])
def test_xformers_on_cpu_is_refused(monkeypatch, installed):
    fake_xformers(monkeypatch, installed)
    with pytest.raises(ValueError, match="needs a CUDA device.*'cpu'"):
        selector.select_backend_name(CPU, "xformers")
    monkeypatch.setenv(selector.ENV_VAR, "xformers")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        selector.get_attn_backend(CPU)


@pytest.mark.parametrize("name", ["flash", "Torch", "sdpa"])
def test_unknown_backend_is_refused(monkeypatch, name):
    with pytest.raises(ValueError, match=f"must be one of.*got '{name}'"):
        selector.select_backend_name(CPU, name)
    monkeypatch.setenv(selector.ENV_VAR, name)
    with pytest.raises(ValueError, match="must be one of"):
        selector.select_backend_name(CUDA)


def test_cuda_without_xformers(monkeypatch):
    fake_xformers(monkeypatch, installed=False)
    assert selector.select_backend_name(CUDA) == "torch"
    with pytest.raises(ValueError, match="xformers is not installed"):
        selector.select_backend_name(CUDA, "xformers")


def test_cuda_with_xformers(monkeypatch):
    fake_xformers(monkeypatch, installed=True)
    assert selector.select_backend_name(CUDA) == "xformers"
    assert selector.select_backend_name(CUDA, "xformers") == "xformers"
    assert selector.select_backend_name(CUDA, "torch") == "torch"


def test_cuda_with_xformers_that_cannot_run(monkeypatch, caplog):
    fake_xformers(monkeypatch, installed=True, failure="NotImplementedError: no CUDA support")
    assert selector.select_backend_name(CUDA) == "torch"
    assert "no CUDA support" in caplog.text
    with pytest.raises(ValueError, match="kernels do not run on cuda: NotImplementedError"):
        selector.select_backend_name(CUDA, "xformers")


def test_the_kernel_probe_reports_a_device_that_fails():
    assert selector.xformers_failure(torch.device("meta")) != ""


def test_cuda_with_xformers_builds_the_xformers_backend(monkeypatch):
    pytest.importorskip("xformers", reason="xformers not installed")
    from encdec.attention.backends.xformers import XFormersBackend
    fake_xformers(monkeypatch, installed=True)
    backend = selector.get_attn_backend(CUDA)
    assert isinstance(backend, XFormersBackend) and backend.name == "xformers"


def test_engine_modules_do_not_import_xformers():
    code = ("import sys, encdec, encdec.attention.selector, encdec.worker.model_runner, "
            "encdec.attention.backends.torch_sdpa; assert 'xformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_probe_names_a_wheel_built_for_another_torch(monkeypatch):
    """xformers' PyPI wheel on another torch build: the user is told why, not the raw dispatch."""
    ops = pytest.importorskip("xformers.ops")

    def no_kernels(*args, **kwargs):
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward` "
                                  "with inputs:\n`cutlassF-pt` is not supported because:\n"
                                  "    xFormers wasn't build with CUDA support")

    monkeypatch.setattr(ops, "memory_efficient_attention", no_kernels)
    selector.xformers_failure.cache_clear()
    try:
        failure = selector.xformers_failure(torch.device("cpu"))
    finally:
        selector.xformers_failure.cache_clear()
    assert "C++/CUDA extensions did not load" in failure and "another torch" in failure
