"""Incremental detokenization: pieces never end inside a character, and add up to the full decode,
for byte-level BPE and SentencePiece-style tokenizers, on random and on real token sequences."""
from __future__ import annotations

import random

import pytest

from encdec.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, decode
from tests.multibyte_tokenizers import MULTILINGUAL, byte_level_bpe, sentencepiece_bpe


@pytest.fixture(scope="module", params=["byte-level-bpe", "sentencepiece"])
def tokenizer(request, tmp_path_factory):
    if request.param == "byte-level-bpe":
        return byte_level_bpe(tmp_path_factory.mktemp("bpe"))
    return sentencepiece_bpe()


def pieces(tokenizer, ids, skip_special_tokens=True) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    out = [detok.step(ids[:i], finished=False) for i in range(1, len(ids))]
    return out + [detok.step(ids, finished=True)]


def test_pieces_of_real_text_add_up_and_never_split_a_character(tokenizer):
    for text in MULTILINGUAL:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        got = pieces(tokenizer, ids)
        assert "".join(got) == decode(tokenizer, ids, True)
        assert not any(p.endswith(REPLACEMENT_CHAR) for p in got)
        assert any(got[:-1])  # streamed, not all held back to the end


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_pieces_of_random_ids_add_up(tokenizer, skip_special_tokens):
    rng = random.Random(0)
    vocab = len(tokenizer)
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        got = pieces(tokenizer, ids, skip_special_tokens)
        assert "".join(got) == decode(tokenizer, ids, skip_special_tokens)
        assert not any(p.endswith(REPLACEMENT_CHAR) for p in got[:-1])
