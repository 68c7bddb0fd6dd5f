"""Tokenizers trained at test time on text with accented letters, CJK and emoji: byte-level BPE
(BART's kind) and SentencePiece-style BPE with byte fallback (T5 / Llama's kind, as Hugging Face
converts them: Metaspace "▁" word starts, bytes for characters outside the vocabulary)."""
from __future__ import annotations

from pathlib import Path

from tests.bart_checkpoints import train_tokenizer

MULTILINGUAL = [
    "Café crème brûlée à Zürich, naïve façade, déjà vu.",
    "東京は日本の首都です。北京欢迎你！서울은 한국의 수도입니다.",
    "I love pizza 🍕 and sushi 🍣 at the party 🎉 with friends 👩‍👩‍👧.",
    "Ünïcödé tëxt wïth äccents: ñ, ø, å, ß, œ, ł, ž and the € sign.",
    "Многие языки используют кириллицу; ελληνικά επίσης.",
    "The quick brown fox jumps over the lazy dog 🦊🐶.",
]


def byte_level_bpe(out_dir: Path, vocab_size: int = 1000):
    """BART-style byte-level BPE trained on the multilingual sentences."""
    return train_tokenizer(out_dir, vocab_size, MULTILINGUAL * 8)


def sentencepiece_bpe(vocab_size: int = 1000):
    """SentencePiece-style BPE with byte fallback, specials <s>=0 <pad>=1 </s>=2 <unk>=3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    special = ["<s>", "<pad>", "</s>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokenizer.train_from_iterator(MULTILINGUAL * 8, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, limit_alphabet=80))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>")
