"""openai-whisper (the `whisper` package) as a reference: the bundled CTranslate2 weights
written as its checkpoint file, its own model loaded from that file.

Its names are Hugging Face's (what `load_ct2_checkpoint` gives) with openai's module names:
blocks / attn / cross_attn / mlp, `ln_post` and `ln` for the final norms, positions as tables.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from encdec.weights.loader import load_ct2_checkpoint

# Hugging Face name piece -> openai-whisper's, in order
RENAMES = [
    (r"^model\.", ""), (r"\.layers\.", ".blocks."), (r"\.fc1\.", ".mlp.0."), (r"\.fc2\.", ".mlp.2."),
    (r"\.final_layer_norm\.", ".mlp_ln."), (r"\.self_attn_layer_norm\.", ".attn_ln."),
    (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."), (r"\.self_attn\.", ".attn."),
    (r"\.encoder_attn\.", ".cross_attn."), (r"\.q_proj\.", ".query."), (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."), (r"\.out_proj\.", ".out."), (r"^encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^decoder\.layer_norm\.", "decoder.ln."),
    (r"^(encoder|decoder)\.embed_positions\.weight$", r"\1.positional_embedding"),
    (r"^decoder\.embed_tokens\.", "decoder.token_embedding."),
]


def openai_name(name: str) -> str:
    for pattern, replacement in RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def openai_whisper_model(model: str, folder: Path):
    """openai-whisper's model of a bundled Whisper (`"tiny.en"`, `"base"`), with the alignment
    heads openai-whisper gives that model by name."""
    import whisper

    config, state = load_ct2_checkpoint(model)
    dims = dict(n_mels=config["num_mel_bins"], n_audio_ctx=config["max_source_positions"],
                n_audio_state=config["d_model"], n_audio_head=config["encoder_attention_heads"],
                n_audio_layer=config["encoder_layers"], n_vocab=config["vocab_size"],
                n_text_ctx=config["max_target_positions"], n_text_state=config["d_model"],
                n_text_head=config["decoder_attention_heads"], n_text_layer=config["decoder_layers"])
    weights = {openai_name(k): v for k, v in state.items() if k != "proj_out.weight"}  # tied
    path = folder / f"{model}.pt"
    torch.save({"dims": dims, "model_state_dict": weights}, path)
    reference = whisper.load_model(str(path), device="cpu")
    reference.set_alignment_heads(whisper._ALIGNMENT_HEADS[model])
    return reference


def assert_words_equal(transcript, result: dict) -> None:
    """Each word's text, times (to 5 ms) and probability, and the segments' times (the same
    numbers)."""
    expected = [(w["word"], w["start"], w["end"], w["probability"]) for s in result["segments"] for w in s["words"]]
    got = [(w.word, w.start, w.end, w.probability) for s in transcript.segments for w in s.words]
    assert [w[0] for w in got] == [w[0] for w in expected]
    assert [t for w in got for t in w[1:3]] == pytest.approx([t for w in expected for t in w[1:3]], abs=0.005)
    assert [w[3] for w in got] == pytest.approx([w[3] for w in expected], abs=0.01)
    # exactly: a segment takes its first word's start and last word's end, rounded to 10 ms
    assert [(s.start, s.end) for s in transcript.segments] == [(s["start"], s["end"]) for s in result["segments"]]
