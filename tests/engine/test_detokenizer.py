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


def test_byte_tokens_printed_as_written_stream_at_once(tmp_path):
    """A T5 tokenizer converted by Hugging Face reads its byte-fallback tokens as written
    (`<0xC3>`): each is final text, so it is given out as it comes (a stop string in a run of
    them is caught there); one that decodes them as bytes holds them for the next token."""
    from encdec.engine.detokenizer import byte_token_ids
    from tests.family_checkpoints import t5_tokenizer

    t5 = t5_tokenizer(tmp_path / "t5")
    ids = t5("Café", add_special_tokens=False)["input_ids"] + [t5.convert_tokens_to_ids(f"<0x{b:02X}>")
                                                                for b in "€".encode()]
    assert decode(t5, ids, True).endswith("<0xE2><0x82><0xAC>") and not byte_token_ids(t5)
    got = pieces(t5, ids)
    assert got[-3:] == ["<0xE2>", "<0x82>", "<0xAC>"] and "".join(got) == decode(t5, ids, True)
    assert len(byte_token_ids(sentencepiece_bpe())) == 256
