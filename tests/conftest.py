"""Shared fixtures: seeded random BART checkpoints and the engine's free-block invariant; one
thread for each pytest-xdist worker."""
from __future__ import annotations

import contextlib
import os

# The servers the tests start listen on loopback: never through a proxy the machine may set.
for _name in ("NO_PROXY", "no_proxy"):
    os.environ[_name] = ",".join(filter(None, [os.environ.get(_name), "127.0.0.1", "localhost"]))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers share the cores: one thread each, for the servers and kernels they start too.
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.bart_checkpoints import make_bart_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_bart_dir(tmp_path_factory):
    return make_bart_checkpoint(tmp_path_factory.mktemp("tiny_bart"), seed=0)


@contextlib.contextmanager
def torch_threads(threads: int):
    """torch (and the kernels that follow it) on `threads` threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def assert_all_blocks_free(llm) -> None:
    """After a run every device and swap block is back in its pool, and no table remains."""
    bm = llm.llm_engine.block_manager
    bm.check_invariants()
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks
    assert bm.get_num_free_cpu_blocks() == bm.num_total_cpu_blocks
    assert not bm.block_tables and not bm.cross_block_tables

