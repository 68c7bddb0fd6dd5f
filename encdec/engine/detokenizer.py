"""Incremental detokenization: the text of a growing token list, a new piece at each step.

Decoding one token at a time is wrong twice over: a byte-level BPE token can hold part of a
UTF-8 character, and SentencePiece drops the space of a word that starts the text it decodes.
So each step decodes a short window, `ids[prefix_offset:]`, and takes what it adds to the
already-read part `ids[prefix_offset:read_offset]` (both see the same leading token, so its
quirks cancel). A piece waits for the next token when it ends in U+FFFD (bytes of a
character still to come) or in a SentencePiece byte-fallback token the tokenizer decodes as
a byte (`<0xE2>`: how it reads depends on the bytes after it, a lone "<" can turn into
U+FFFD); one that prints them as written (`"<0xE2>"`) gives them out at once. On the last
step the piece is whatever the full decode adds to the text given so far, so the pieces add up to
`tokenizer.decode(ids)` exactly (unless that decode rewrites text already given: then the last
piece is empty).

Text is decoded with `clean_up_tokenization_spaces=False` (as Hugging Face's text2text
pipelines do): that clean-up rewrites text before a token that has not arrived yet.
"""
from __future__ import annotations

import re
import weakref
from typing import Any

REPLACEMENT_CHAR = "\ufffd"
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
_byte_tokens: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()


def decode(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> str:
    """The one way encdec turns a completion's token ids into text."""
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=False)


def byte_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the tokenizer's byte-fallback tokens `<0x00>` .. `<0xFF>` when it decodes them as
    bytes (`<0x41>` as "A"); none for byte-level BPE, nor where they read as they are written."""
    ids = _byte_tokens.get(tokenizer)
    if ids is None:
        vocab = tokenizer.get_vocab()
        letter = vocab.get("<0x41>")
        as_bytes = letter is not None and decode(tokenizer, [letter], False) == "A"
        ids = _byte_tokens[tokenizer] = frozenset(i for token, i in vocab.items()
                                                  if as_bytes and _BYTE_TOKEN.match(token))
    return ids


class IncrementalDetokenizer:
    """Text pieces of one sequence's output ids; `text` is everything given out so far."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.byte_tokens = byte_token_ids(tokenizer)
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0

    def step(self, ids: list[int], finished: bool = False) -> str:
        """The new piece of text for `ids` (the whole output so far); "" while it waits."""
        if finished:
            full = decode(self.tokenizer, ids, self.skip_special_tokens)
            piece = full[len(self.text):] if full.startswith(self.text) else ""
        else:
            read = decode(self.tokenizer, ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
            window = decode(self.tokenizer, ids[self.prefix_offset:], self.skip_special_tokens)
            if (len(window) <= len(read) or window.endswith(REPLACEMENT_CHAR)
                    or ids[-1] in self.byte_tokens or not window.startswith(read)):
                return ""
            piece = window[len(read):]
            self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.text += piece
        return piece
