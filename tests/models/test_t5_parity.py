"""T5 (v1.0: ReLU, tied LM head with the d_model ** -0.5 rescale), Flan-T5 (gated-GELU, its own
LM head) and mT5 (Flan-T5's layers, its config named MT5ForConditionalGeneration / "mt5") through
the engine equal Hugging Face, relative position bias included."""
from __future__ import annotations

import pytest

from tests.family_parity import FamilyParity


@pytest.fixture(scope="module", params=["t5", "flan-t5", "mt5"])
def family(request):
    return request.param


class TestT5Parity(FamilyParity):
    pass
