"""Which model family a checkpoint's config picks."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from encdec.models.registry import get_model_family


@pytest.mark.parametrize("architectures, model_type, family", [
    (["MT5ForConditionalGeneration"], "mt5", "t5"),
    (["T5WithLMHeadModel"], "t5", "t5"),  # the name older T5 configs carry
    (None, "mt5", "t5"),  # no architectures: the model_type decides, as Hugging Face's Auto classes
    ([], "marian", "marian"),
    (["PegasusForConditionalGeneration"], "pegasus", "pegasus"),
])
def test_family_by_architecture_else_model_type(architectures, model_type, family):
    config = SimpleNamespace(architectures=architectures, model_type=model_type)
    assert get_model_family(config).model_type == family


@pytest.mark.parametrize("architectures, model_type", [
    (["BartForSequenceClassification"], "bart"),  # a classifier: its model_type does not make it generate
    (["T5EncoderModel"], "t5"),
    (None, "bert"),
])
def test_what_does_not_generate_is_refused(architectures, model_type):
    expected = f"unsupported model: architectures {architectures or []}, model_type '{model_type}'; supported: ["
    with pytest.raises(ValueError, match="^" + re.escape(expected)):
        get_model_family(SimpleNamespace(architectures=architectures, model_type=model_type))
