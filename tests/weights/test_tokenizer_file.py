"""`TokenizerFile` (tokenizer.json through `tokenizers`) encodes and decodes as transformers'
`PreTrainedTokenizerFast` over the same file, which bundled Whisper models loaded before."""
from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerFast

from encdec.weights.tokenizer_file import TokenizerFile
from encdec.weights.whisper_assets import resolve_whisper_model


@pytest.fixture(scope="module")
def tokenizers():
    path = resolve_whisper_model("tiny.en").tokenizer_json
    return TokenizerFile(path), PreTrainedTokenizerFast(tokenizer_file=str(path))


def test_vocabularies_match(tokenizers):
    ours, theirs = tokenizers
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.get_added_vocab() == theirs.get_added_vocab()


@pytest.mark.parametrize("text", ["Thank you for calling.", " naïve café, 日本語!", "  two  spaces "])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encoding_matches(tokenizers, text, add_special_tokens):
    ours, theirs = tokenizers
    expected = theirs(text, add_special_tokens=add_special_tokens)["input_ids"]
    assert ours(text, add_special_tokens=add_special_tokens)["input_ids"] == expected
    assert ours([text, "a"], add_special_tokens=add_special_tokens)["input_ids"] == \
        theirs([text, "a"], add_special_tokens=add_special_tokens)["input_ids"]
    assert ours(text_target=text, add_special_tokens=add_special_tokens)["input_ids"] == \
        theirs(text_target=text, add_special_tokens=add_special_tokens)["input_ids"]


def test_decoding_matches_on_random_ids(tokenizers):
    ours, theirs = tokenizers
    rng, size = random.Random(0), len(theirs.get_vocab())
    for _ in range(500):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 12))]
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == \
            theirs.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_space_clean_up_is_refused(tokenizers):
    with pytest.raises(ValueError, match="clean up"):
        tokenizers[0].decode([1, 2], clean_up_tokenization_spaces=True)


def test_conversions_match(tokenizers):
    ours, theirs = tokenizers
    tokens = ["<|startofprev|>", "<|endoftext|>", "Ġhello", "no-such-token"]
    assert ours.convert_tokens_to_ids(tokens[0]) == theirs.convert_tokens_to_ids(tokens[0])
    assert ours.convert_tokens_to_ids(tokens[:3]) == theirs.convert_tokens_to_ids(tokens[:3])
    assert ours.convert_tokens_to_ids(tokens[3]) is None
    assert ours.convert_ids_to_tokens([0, 50256, 50360]) == theirs.convert_ids_to_tokens([0, 50256, 50360])
    assert ours.convert_ids_to_tokens(7) == theirs.convert_ids_to_tokens(7)
    assert ours.encode("Hi there") == theirs.encode("Hi there")
    assert ours.batch_decode([[1, 2], [3]]) == theirs.batch_decode([[1, 2], [3]])
    assert len(ours) == len(theirs)
