"""Seeded random-weight checkpoints of T5 / Flan-T5, mBART-50, Marian and PEGASUS, written with
`save_pretrained` at test time, each with a SentencePiece tokenizer trained here (no downloads).

Widths, heads, activations and special tokens are the published configs'; the vocabulary is the
test tokenizer's (a few hundred pieces), and the default tests reduce the layers to two per side.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from tests.bart_checkpoints import CORPUS
from tests.multibyte_tokenizers import MULTILINGUAL

TEXTS = CORPUS + MULTILINGUAL

# google-t5/t5-small and google/flan-t5-small (config.json).
T5_SMALL = dict(
    d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
    relative_attention_num_buckets=32, relative_attention_max_distance=128,
    feed_forward_proj="relu", layer_norm_epsilon=1e-6, n_positions=512, pad_token_id=0,
    eos_token_id=1, decoder_start_token_id=0,
    task_specific_params={
        "summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 200, "min_length": 30,
                          "no_repeat_ngram_size": 3, "num_beams": 4, "prefix": "summarize: "},
        **{f"translation_en_to_{code}": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                                         "prefix": f"translate English to {language}: "}
           for code, language in (("de", "German"), ("fr", "French"), ("ro", "Romanian"))}},
)
FLAN_T5_SMALL = dict(T5_SMALL, d_ff=1024, num_layers=8, num_decoder_layers=8, num_heads=6,
                     feed_forward_proj="gated-gelu", tie_word_embeddings=False)
# google/mt5-small: Flan-T5's layers (T5 v1.1), no task prefixes
MT5_SMALL = {key: value for key, value in FLAN_T5_SMALL.items() if key != "task_specific_params"}
# facebook/mbart-large-50-many-to-many-mmt
MBART_LARGE_50 = dict(
    d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
    max_position_embeddings=1024, activation_function="gelu", scale_embedding=True,
    bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
)
# Helsinki-NLP/opus-mt-en-de (pad and decoder start are the last id of its vocabulary)
OPUS_MT = dict(
    d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
    max_position_embeddings=512, activation_function="swish", scale_embedding=True,
    eos_token_id=0, forced_eos_token_id=0,
)
# google/pegasus-xsum
PEGASUS_XSUM = dict(
    d_model=1024, encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
    max_position_embeddings=512, activation_function="relu", scale_embedding=True,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=1,
)
# Weight stds that keep random outputs varied across prompts and steps (see DEEP_INIT_STDS in
# tests/bart_checkpoints.py): a strong decoder self-attention, a quiet encoder.
# PEGASUS scales its token embeddings by sqrt(1024) and adds unlearned positions: smaller ones.
# Flan-T5's gated feed-forward and cross-attention need larger weights to move its residual stream.
INIT_STDS = {"relative_attention_bias": 1.0, "decoder_self_attention": 0.4,
             "encoder_self_attention": 0.05, "cross_attention": 0.1, "embeddings": 0.2,
             "feed_forward": 0.02}
FAMILY_INIT_STDS = {"pegasus": dict(INIT_STDS, embeddings=0.02),
                    "flan-t5": dict(INIT_STDS, feed_forward=0.1, cross_attention=0.3)}
FAMILY_INIT_STDS["mt5"] = FAMILY_INIT_STDS["flan-t5"]
# T5 v1.0 at full depth (6 + 6 layers): with INIT_STDS, float32 rounding alone moves its
# log-probabilities by 0.1 (Hugging Face's float32 against its float64), so greedy paths part
# anywhere. A quieter decoder self-attention, T5's own embedding std (its tied head is rescaled
# by d_model ** -0.5) and a stronger feed-forward keep that under 1e-4 and outputs varied.
T5_FULL_SHAPE_STDS = dict(INIT_STDS, decoder_self_attention=0.05, embeddings=1.0,
                          feed_forward=0.2)
# Marian at full depth: with INIT_STDS its scaled (x sqrt(512)) tied embeddings dominate the
# residual stream and every output repeats one token; smaller embeddings (0.05, with a 0.02
# encoder) give a chaotic model (HF float32 and float64 greedy part on 3 of 16 prompts). A
# quieter decoder self-attention keeps float32's logit error ~2e-4, under the smallest greedy
# margin (~4e-3).
MARIAN_FULL_SHAPE_STDS = dict(INIT_STDS, decoder_self_attention=0.05,
                              encoder_self_attention=0.02, embeddings=0.05)
FULL_SHAPE_INIT_STDS = {"t5": T5_FULL_SHAPE_STDS,
                        # Flan-T5 at full depth (8 + 8 layers): with its two-layer 0.3
                        # cross-attention, float32 logits move by up to 8 against float64 and
                        # greedy paths part on 3 to 9 of 16 prompts; T5's full-shape stds keep the
                        # error at ~4e-3, 10x under the smallest greedy margin.
                        "flan-t5": T5_FULL_SHAPE_STDS,
                        "marian": MARIAN_FULL_SHAPE_STDS,
                        "marian-separate": MARIAN_FULL_SHAPE_STDS,
                        # PEGASUS at full depth (16 + 16 pre-LN layers): the 0.4 decoder
                        # self-attention makes float32 and float64 greedy paths part on half the
                        # prompts; 0.2 agrees on all and still varies (0.05 repeats one token).
                        "pegasus": dict(FAMILY_INIT_STDS["pegasus"], decoder_self_attention=0.2),
                        # mBART-50 at full depth (12 + 12 pre-LN layers): a 0.2 decoder
                        # self-attention already parts float32 from float64 greedy on one prompt,
                        # at 0.1 outputs repeat one token; 0.15 agrees on all and greedy varies.
                        # Its 0.1 cross-attention barely reads the source (5 distinct beam outputs
                        # of 16); 0.2 gives 15 and keeps float32's logit error ~4e-4.
                        "mbart-50": dict(INIT_STDS, decoder_self_attention=0.15,
                                         cross_attention=0.2)}
FULL_SHAPE_INIT_STDS["mt5"] = FULL_SHAPE_INIT_STDS["flan-t5"]  # Flan-T5's layers
TWO_LAYERS = {"t5": dict(num_layers=2, num_decoder_layers=2),
              "bart": dict(encoder_layers=2, decoder_layers=2)}


def train_sentencepiece(vocab_size: int, texts: list[str] = TEXTS, byte_fallback: bool = True,
                        **special_ids: int) -> bytes:
    """A unigram SentencePiece model (its serialized bytes) over `texts`."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 4), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", byte_fallback=byte_fallback, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2, **special_ids)
    return model.getvalue()


def t5_tokenizer(folder: Path, extra_ids: int = 10):
    """T5's: pad 0, eos 1, unk 2, `extra_ids` <extra_id_N> sentinels at the end."""
    from transformers import T5Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(train_sentencepiece(400, pad_id=0, eos_id=1, unk_id=2, bos_id=-1))
    return T5Tokenizer.from_pretrained(str(folder), extra_ids=extra_ids)


def pegasus_tokenizer(folder: Path):
    """PEGASUS's: pad 0, eos 1, mask tokens and <unk_N> fillers before the pieces (offset 103)."""
    from transformers import PegasusTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(train_sentencepiece(400, pad_id=0, eos_id=1, unk_id=2, bos_id=-1))
    return PegasusTokenizer.from_pretrained(str(folder))


def mbart50_tokenizer(folder: Path):
    """mBART-50's: fairseq ids <s> 0, <pad> 1, </s> 2, <unk> 3, pieces, 52 language codes, <mask>."""
    from transformers import MBart50Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(
        train_sentencepiece(400, unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    return MBart50Tokenizer.from_pretrained(str(folder), src_lang="en_XX")


def marian_tokenizer(folder: Path, separate_vocabs: bool):
    """Marian's: English source pieces, multilingual target pieces; </s> 0, <unk> 1. One
    vocabulary with >>de<< and >>fr<< target tokens and <pad> last, or (`separate_vocabs`) one
    per side, both with <pad> 2 (the embeddings' padding index must fit both)."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    models = {}
    for side, texts in (("source", CORPUS), ("target", MULTILINGUAL)):
        models[side] = train_sentencepiece(300, texts, byte_fallback=False, eos_id=0, unk_id=1,
                                           bos_id=-1, pad_id=-1)
        (folder / f"{side}.spm").write_bytes(models[side])

    def pieces(side: str) -> list[str]:
        processor = spm.SentencePieceProcessor(model_proto=models[side])
        return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]

    if separate_vocabs:
        vocabs = {name: pieces(side)[:2] + ["<pad>"] + pieces(side)[2:]
                  for name, side in (("vocab.json", "source"), ("target_vocab.json", "target"))}
    else:
        target = [p for p in pieces("target") if p not in set(pieces("source"))]
        vocabs = {"vocab.json": pieces("source") + target + [">>de<<", ">>fr<<", "<pad>"]}
    for name, vocab in vocabs.items():
        (folder / name).write_text(json.dumps({p: i for i, p in enumerate(vocab)}))
    return MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                           str(folder / "vocab.json"),
                           target_vocab_file=str(folder / "target_vocab.json") if separate_vocabs else None,
                           separate_vocabs=separate_vocabs)


def init_std(name: str, stds: dict = INIT_STDS) -> float:
    """The `stds` entry for a Hugging Face weight matrix of any of these families."""
    if "relative_attention_bias" in name:
        return stds["relative_attention_bias"]
    if "EncDecAttention" in name or "encoder_attn" in name:
        return stds["cross_attention"]
    if "SelfAttention" in name or "self_attn" in name:
        side = "decoder" if name.startswith(("decoder.", "model.decoder.")) else "encoder"
        return stds[f"{side}_self_attention"]
    if any(part in name for part in ("shared", "embed", "lm_head")):
        return stds["embeddings"]
    return stds["feed_forward"]


def make_family_checkpoint(family: str, out_dir: Path, seed: int = 0, full: bool = False,
                           tokenizer=None, **overrides) -> Path:
    """Save a seeded random checkpoint of `family` ("t5", "flan-t5", "mt5", "mbart-50", "marian",
    "marian-separate", "pegasus") and its tokenizer to `out_dir`: two layers per side unless
    `full`; `overrides` change the config."""
    from transformers import (MarianConfig, MarianMTModel, MBartConfig,
                              MBartForConditionalGeneration, MT5Config,
                              MT5ForConditionalGeneration, PegasusConfig,
                              PegasusForConditionalGeneration, T5Config,
                              T5ForConditionalGeneration)

    out_dir = Path(out_dir)
    build = {
        "t5": (T5_SMALL, T5Config, T5ForConditionalGeneration, t5_tokenizer),
        "flan-t5": (FLAN_T5_SMALL, T5Config, T5ForConditionalGeneration, t5_tokenizer),
        "mt5": (MT5_SMALL, MT5Config, MT5ForConditionalGeneration, t5_tokenizer),
        "mbart-50": (MBART_LARGE_50, MBartConfig, MBartForConditionalGeneration, mbart50_tokenizer),
        "marian": (OPUS_MT, MarianConfig, MarianMTModel,
                   lambda folder: marian_tokenizer(folder, separate_vocabs=False)),
        "marian-separate": (OPUS_MT, MarianConfig, MarianMTModel,
                            lambda folder: marian_tokenizer(folder, separate_vocabs=True)),
        "pegasus": (PEGASUS_XSUM, PegasusConfig, PegasusForConditionalGeneration, pegasus_tokenizer),
    }
    published, config_cls, model_cls, make_tokenizer = build[family]
    tokenizer = tokenizer or make_tokenizer(out_dir / "_spm")
    values = dict(published, vocab_size=len(tokenizer))
    if family.startswith("marian"):
        values.update(pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    if family == "marian-separate":
        values.update(vocab_size=len(tokenizer.encoder),
                      decoder_vocab_size=len(tokenizer.target_encoder),
                      share_encoder_decoder_embeddings=False)
    if not full:
        values.update(TWO_LAYERS["t5" if "t5" in family else "bart"])
    config = config_cls(**{**values, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        stds = FAMILY_INIT_STDS.get(family, INIT_STDS)
        if full:
            stds = FULL_SHAPE_INIT_STDS.get(family, stds)
        for name, param in model.named_parameters():
            if param.dim() == 2 and param.requires_grad:  # not the static sinusoidal tables
                param.normal_(0.0, init_std(name, stds))
        if hasattr(model, "final_logits_bias"):  # non-zero: checks that it is loaded and applied
            model.final_logits_bias.normal_(0.0, 0.05)
    model.save_pretrained(str(out_dir))
    if family in ("flan-t5", "mt5"):
        untie_t5_head(out_dir)
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def untie_t5_head(model_dir: Path) -> None:
    """Give a saved T5 its own LM head, as Flan-T5 and mT5 ship (transformers 5 builds them tied)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    weights["lm_head.weight"] = torch.randn_like(weights["shared.weight"]) * INIT_STDS["embeddings"]
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config.update(tie_word_embeddings=False, scale_decoder_outputs=False)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
