"""Texts far longer than a model takes, tokenized in pieces so that the tokenizer's memory is a
piece's, not the text's.

A fast tokenizer holds a few hundred bytes a token while it encodes (offsets, masks, the
tokens' strings): a 20 MB article took 4.4 GB before its first 256 tokens were kept. A text over
PIECE_CHARS characters is cut into pieces just before whitespace, where pre-tokenization splits
words anyway, so each piece's tokens are the text's own there. Only the piece at the end that is
kept (the head or the tail) is returned as ids, encoded with the special tokens as the whole
text would be; the others are only counted.
"""
from __future__ import annotations

from typing import Any, Iterator

PIECE_CHARS = 100_000
WHITESPACE = (" ", "\n", "\t", "\r")


def pieces(text: str, size: int) -> Iterator[str]:
    """`text` in pieces of at most `size` characters, each cut before a whitespace character in
    its second half where there is one."""
    start = 0
    while len(text) - start > size:
        end = max(text.rfind(space, start + size // 2, start + size) for space in WHITESPACE)
        end = end if end > start else start + size
        yield text[start:end]
        start = end
    yield text[start:]


def encode_long(tokenizer: Any, text: str, keep: int, from_end: bool = False) -> tuple[list[int], int]:
    """(ids, count): the ids of `text` with its special tokens, and how many the whole text has.
    A text over PIECE_CHARS gives the ids of its first piece (its last with `from_end`), which hold
    more than `keep` tokens, as the whole text's head (tail) has them, with the special tokens
    the tokenizer puts around a text; the count sums the other pieces' tokens."""
    if len(text) <= PIECE_CHARS:
        ids = list(tokenizer(text, verbose=False)["input_ids"])
        return ids, len(ids)
    parts = list(pieces(text, PIECE_CHARS))
    kept = parts.pop(-1 if from_end else 0)
    while from_end and len(kept) < PIECE_CHARS // 2:  # the last piece is what is left: one more
        kept = parts.pop() + kept
    ids = list(tokenizer(kept, verbose=False)["input_ids"])
    if len(ids) <= keep + tokenizer.num_special_tokens_to_add():  # a piece of very long tokens
        ids = list(tokenizer(text, verbose=False)["input_ids"])
        return ids, len(ids)
    others = sum(len(tokenizer(part, add_special_tokens=False, verbose=False)["input_ids"]) for part in parts)
    return ids, len(ids) + others
