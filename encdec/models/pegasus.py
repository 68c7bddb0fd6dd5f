"""PEGASUS: BART with pre-LayerNorm layers, a final `layer_norm` on each stack, static sinusoidal
positions and no `layernorm_embedding`. The decoder starts with the pad token."""
from __future__ import annotations

from encdec.models.bart import BartForConditionalGeneration, BartVariant


class PegasusForConditionalGeneration(BartForConditionalGeneration):
    variant = BartVariant(normalize_before=True, layernorm_embedding=False,
                          sinusoidal_positions=True)
