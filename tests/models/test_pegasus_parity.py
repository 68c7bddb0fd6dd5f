"""PEGASUS (pre-LayerNorm, final layer norms, sinusoidal positions) through the engine equals
Hugging Face."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from encdec import LLM
from tests.family_checkpoints import make_family_checkpoint
from tests.family_parity import FamilyParity


@pytest.fixture(scope="module")
def family():
    return "pegasus"


class TestPegasusParity(FamilyParity):
    pass


def test_positions_are_computed_when_the_checkpoint_has_none(tmp_path, family_dir):
    """PEGASUS saves its sinusoidal tables; a checkpoint without them gets the same ones."""
    model_dir = make_family_checkpoint("pegasus", tmp_path / "no_positions", seed=1)
    weights = load_file(str(model_dir / "model.safetensors"))
    saved = weights.pop("model.encoder.embed_positions.weight")
    weights.pop("model.decoder.embed_positions.weight")
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "pegasus"
    model = LLM(model=str(model_dir), num_gpu_blocks=16).llm_engine.model_runner.model
    for stack in (model.model.encoder, model.model.decoder):
        torch.testing.assert_close(stack.embed_positions.weight, saved, rtol=0, atol=1e-6)
