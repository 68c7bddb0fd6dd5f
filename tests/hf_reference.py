"""Hugging Face greedy references for parity tests."""
from __future__ import annotations

import torch


@torch.inference_mode()
def hf_greedy(model, encoder_ids: list[int], decoder_ids: list[int], max_new_tokens: int,
              eos_token_id: int) -> list[int]:
    """Tokens HF `generate()` appends to `decoder_ids`, greedy, with no logits processors
    (inputs go to the model's device)."""
    out = model.generate(
        torch.tensor([encoder_ids], device=model.device),
        decoder_input_ids=torch.tensor([decoder_ids], device=model.device),
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_length=0,
        no_repeat_ngram_size=0, repetition_penalty=1.0, forced_bos_token_id=None,
        forced_eos_token_id=None, eos_token_id=eos_token_id, pad_token_id=1)
    return out[0, len(decoder_ids):].tolist()


NEAR_TIE = 1e-4


@torch.inference_mode()
def divergence_margin(model, encoder_ids: list[int], decoder_ids: list[int],
                      engine_ids: list[int], expected: list[int]) -> float:
    """Top-1 minus the logit of the engine's choice, where the engine first left HF's path.

    Float rounding differs between a batched paged engine and HF's dense one, so when two
    logits tie to ~1e-6 the greedy paths may part; anything larger is a real difference.
    """
    step = next(i for i, (a, b) in enumerate(zip(engine_ids, expected)) if a != b)
    logits = model(input_ids=torch.tensor([encoder_ids], device=model.device),
                   decoder_input_ids=torch.tensor([decoder_ids + expected[:step]],
                                                  device=model.device)).logits[0, -1]
    return (logits.max() - logits[engine_ids[step]]).item()
