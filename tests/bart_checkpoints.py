"""Seeded random-weight BART checkpoints, written with `save_pretrained` at test time.

A byte-level BPE tokenizer is trained on a small built-in corpus, so text prompts work offline.
"""
from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "The rain in spain falls mainly on the plain.",
    "Paged attention keeps keys and values in fixed-size blocks addressed through block tables.",
    "An encoder reads the whole document once; the decoder writes the summary one token at a time.",
    "Continuous batching lets new requests join while others are still being decoded.",
    "Whisper turns thirty seconds of audio into a log-mel spectrogram before the encoder sees it.",
    "Summaries of long articles should keep the facts and drop the repetition.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "Numbers like 3, 14, 159 and 2026 appear in reports, tables and financial statements.",
]

# facebook/bart-base as published (config.json), minus the generation fields.
BART_BASE = dict(
    vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
    decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
    max_position_embeddings=1024, activation_function="gelu", scale_embedding=False,
    pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    forced_eos_token_id=2, normalize_before=False, add_final_layer_norm=False,
)

TINY = dict(BART_BASE, vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=256)


# Per-module init stds for the full 6+6-layer shape. One std everywhere makes the deep random
# model emit one token forever: large stds wash the decoder's own tokens out under the
# encoder's common component, small ones let the residual path repeat the current token
# through the tied LM head. A quiet encoder and cross-attention, weak feed-forwards and a
# strong decoder self-attention keep outputs varied across prompts and steps.
DEEP_INIT_STDS = {"encoder_attention": 0.02, "decoder_self_attention": 0.1,
                  "cross_attention": 0.02, "ffn": 0.01, "token_embeddings": 0.05,
                  "position_embeddings": 0.1}


def module_init_std(name: str, stds: dict) -> float:
    """The std in `stds` for the BART weight matrix called `name`."""
    if ".fc1." in name or ".fc2." in name:
        return stds["ffn"]
    if ".encoder_attn." in name:
        return stds["cross_attention"]
    if ".self_attn." in name:
        return stds["encoder_attention" if "encoder." in name else "decoder_self_attention"]
    if "embed_positions" in name:
        return stds["position_embeddings"]
    return stds["token_embeddings"]


def apply_init_stds(model, stds: dict) -> None:
    """Redraw every weight matrix of `model` from N(0, its module's std)."""
    for name, param in model.named_parameters():
        if name.endswith("weight") and param.dim() == 2:
            param.normal_(0.0, module_init_std(name, stds))


def train_tokenizer(out_dir: Path, vocab_size: int = 1000, corpus: list[str] = CORPUS * 4):
    """A BART-style byte-level BPE tokenizer trained on `corpus`: specials <s>=0 <pad>=1 </s>=2
    <unk>=3 <mask>."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(out_dir))
    return BartTokenizerFast(vocab=str(out_dir / "vocab.json"), merges=str(out_dir / "merges.txt"))


def make_bart_checkpoint(out_dir: Path, seed: int = 0, init_std: float = 0.3,
                         weights_format: str = "safetensors", eos_logit_bias: float = 0.0,
                         init_stds: dict | None = None, tokenizer=None, **overrides) -> Path:
    """Save a seeded random BART (TINY shape unless overridden) plus tokenizer to `out_dir`.

    `weights_format`: "safetensors", "sharded" (several safetensors files and an index) or
    "bin" (a single pytorch_model.bin, as older checkpoints ship). `eos_logit_bias` raises
    EOS's final_logits_bias so that some outputs stop early. `init_stds` (e.g.
    DEEP_INIT_STDS) replaces the single `init_std` with one std per kind of module.
    `tokenizer` replaces the one trained on CORPUS.
    """
    from transformers import BartConfig, BartForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = tokenizer or train_tokenizer(out_dir / "_bpe")
    config = BartConfig(**{**TINY, **overrides, "init_std": init_std})
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():  # a non-zero final_logits_bias checks that it is loaded and applied
        if init_stds:
            apply_init_stds(model, init_stds)
        model.final_logits_bias.normal_(0.0, 0.05)
        model.final_logits_bias[0, config.eos_token_id] += eos_logit_bias
    if weights_format == "bin":
        model.save_pretrained(str(out_dir))
        (out_dir / "model.safetensors").unlink()
        torch.save(model.state_dict(), out_dir / "pytorch_model.bin")
    else:
        model.save_pretrained(str(out_dir), max_shard_size="100KB" if weights_format == "sharded" else "50GB")
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def summary_prompts(llm, articles: list) -> list[dict]:
    """The engine prompts of `articles` (text or token-id prompts) as `encdec summarize` and
    /v1/summarize make them: the decoder at <DEC> alone, where Hugging Face's generate() starts."""
    start = llm.llm_engine.model_config.decoder_start_token_id
    return [{"encoder_prompt": article, "decoder_prompt": {"prompt_token_ids": [start]}} for article in articles]
