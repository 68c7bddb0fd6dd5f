"""Texts far longer than a model takes, tokenized in pieces so that the tokenizer's memory is a
piece's, not the text's.

A fast tokenizer holds a few hundred bytes a token while it encodes (offsets, masks, the
tokens' strings): a 20 MB article took 4.4 GB before its first 256 tokens were kept. A text over
PIECE_CHARS characters is cut into pieces, just before whitespace where there is some (where
pre-tokenization splits words anyway). Only the piece at the end that is kept (the head or the
tail) is returned as ids, encoded with the special tokens as the whole text would be; the others
are only counted. A cut can still split what the tokenizer reads as one (a text without spaces,
a SentencePiece word): each cut's count is mended by what the text SEAM_CHARS either side of it
has as one and as two (a tokenizer's reading of one place depends on its neighbourhood only).
"""
from __future__ import annotations

from typing import Any, Iterator

from encdec.inputs.tokenizing import encode

PIECE_CHARS = 100_000
SEAM_CHARS = 1000
WHITESPACE = (" ", "\n", "\t", "\r")


def cuts(text: str, size: int) -> Iterator[int]:
    """Where to cut `text` into pieces of at most `size` characters: before a whitespace
    character in each piece's second half where there is one."""
    start = 0
    while len(text) - start > size:
        end = max(text.rfind(space, start + size // 2, start + size) for space in WHITESPACE)
        start = end if end > start else start + size
        yield start


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(encode(tokenizer, text=text, add_special_tokens=False, verbose=False))


def seam_tokens(tokenizer: Any, text: str, cut: int) -> int:
    """The tokens the text has at `cut` beyond those of its two sides tokenized apart."""
    left, right = text[max(0, cut - SEAM_CHARS):cut], text[cut:cut + SEAM_CHARS]
    return count_tokens(tokenizer, left + right) - count_tokens(tokenizer, left) - count_tokens(tokenizer, right)


def encode_long(tokenizer: Any, text: str, keep: int, from_end: bool = False) -> tuple[list[int], int]:
    """(ids, count): the ids of `text` with its special tokens, and how many the whole text has.
    A text over PIECE_CHARS gives the ids of its first piece (its last with `from_end`), which hold
    more than `keep` tokens, as the whole text's head (tail) has them, with the special tokens
    the tokenizer puts around a text; the count sums the other pieces' tokens and the seams'."""
    if len(text) <= PIECE_CHARS:
        ids = encode(tokenizer, text=text, verbose=False)
        return ids, len(ids)
    bounds = [0, *cuts(text, PIECE_CHARS), len(text)]
    if from_end:
        while len(bounds) > 2 and bounds[-1] - bounds[-2] < PIECE_CHARS // 2:  # a short last piece: one more
            del bounds[-2]
    kept = bounds[-2:] if from_end else bounds[:2]
    ids = encode(tokenizer, text=text[kept[0]:kept[1]], verbose=False)
    if len(ids) <= keep + tokenizer.num_special_tokens_to_add():  # a piece of very long tokens
        ids = encode(tokenizer, text=text, verbose=False)
        return ids, len(ids)
    others = sum(count_tokens(tokenizer, text[start:end]) for start, end in zip(bounds, bounds[1:])
                 if start != kept[0])
    return ids, len(ids) + others + sum(seam_tokens(tokenizer, text, cut) for cut in bounds[1:-1])
