"""CUDA tests: every test in this folder carries the `cuda` marker and skips with "no CUDA
device" where torch sees no GPU, so the default (CPU) run collects and skips them.

Speech for the Whisper tests is the espeak-ng corpus of `tests/whisper` (the same fixtures).
Where espeak-ng is missing (a lent GPU machine), the same clips made elsewhere can be handed
over as `clip{i}.wav` files in the folder named by $ENCDEC_TEST_AUDIO_DIR.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.speech_corpus import CORPUS
from tests.whisper.conftest import (Clip, corpus, speech_dir,  # noqa: F401 (fixtures)
                                    tiny_en_assets)

HERE = Path(__file__).parent
AUDIO_DIR_VAR = "ENCDEC_TEST_AUDIO_DIR"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.cuda)
            item.add_marker(no_cuda, append=False)  # its reason first, before other skips


@pytest.fixture(scope="session")
def speech(request) -> list[Clip]:
    """The Whisper tests' corpus: synthesized here, or read from $ENCDEC_TEST_AUDIO_DIR."""
    if shutil.which("espeak-ng") is not None:
        return request.getfixturevalue("corpus")
    folder = os.environ.get(AUDIO_DIR_VAR)
    if not folder:
        pytest.skip(f"espeak-ng is not installed and ${AUDIO_DIR_VAR} is not set")
    from encdec.audio import load_audio

    paths = [Path(folder) / f"clip{i}.wav" for i in range(len(CORPUS))]
    return [Clip(text, load_audio(path)) for (_, _, text), path in zip(CORPUS, paths)]


@pytest.fixture(scope="session")
def hf_tiny_en(tiny_en_assets):
    """Hugging Face Whisper built from the bundled tiny.en weights, float32 on cuda."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from encdec.weights.loader import load_ct2_checkpoint

    config, state = load_ct2_checkpoint(tiny_en_assets)
    model = WhisperForConditionalGeneration(WhisperConfig(**config)).eval()
    model.load_state_dict(state, strict=True)
    return model.to("cuda")

