"""Fixtures of the family parity tests (tests/family_parity.py): a module's `family` picks the
checkpoint, built twice: two layers per side, and the published shape (slow; `-m slow`);
`decoding` holds settings every request and Hugging Face's generate() get."""
from __future__ import annotations

import pytest

from tests.family_checkpoints import make_family_checkpoint
from tests.family_parity import run_batch
from tests.hf_reference import HFReference


@pytest.fixture(scope="module", params=[False, pytest.param(True, marks=pytest.mark.slow)],
                ids=["two-layers", "full-shape"])
def full_shape(request):
    return request.param


@pytest.fixture(scope="module")
def family_dir(family, full_shape, tmp_path_factory):
    return make_family_checkpoint(family, tmp_path_factory.mktemp(family), seed=0, full=full_shape)


@pytest.fixture(scope="module")
def reference(family_dir):
    return HFReference(family_dir)


@pytest.fixture(scope="module")
def decoding():
    return {}


@pytest.fixture(scope="module")
def plain_outputs(family_dir, reference, decoding):
    """The outputs of an engine run with room for every request (checked in `run_batch`)."""
    return run_batch(family_dir, reference, decoding, num_gpu_blocks=2048)[1]
