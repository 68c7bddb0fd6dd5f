"""Long texts: tokenized in pieces, with the ids and counts of the whole text, and cut as
Hugging Face's `truncation=True` cuts them."""
from __future__ import annotations

import asyncio
import threading

import pytest

from encdec.entrypoints.summaries import closing_tokens, fit_article
from encdec.inputs import long_texts
from encdec.inputs.long_texts import encode_long
from tests.bart_checkpoints import train_tokenizer
from tests.family_checkpoints import TEXTS, marian_tokenizer, mbart50_tokenizer, pegasus_tokenizer, t5_tokenizer

MAKERS = {"bart": train_tokenizer, "t5": t5_tokenizer, "pegasus": pegasus_tokenizer,
          "mbart50": mbart50_tokenizer, "marian": lambda folder: marian_tokenizer(folder, separate_vocabs=False)}
SPACES = [" ", "\n\n", "  ", "\t", " \n "]


@pytest.fixture(scope="module", params=sorted(MAKERS))
def tokenizer(request, tmp_path_factory):
    return MAKERS[request.param](tmp_path_factory.mktemp(request.param))


def long_text(chars: int) -> str:
    words, length = [], 0
    while length < chars:
        words.append(TEXTS[len(words) % len(TEXTS)] + SPACES[len(words) % len(SPACES)])
        length += len(words[-1])
    return "".join(words) + "end ☃☃ 😀"


def test_pieces_are_cut_before_whitespace():
    text = long_text(50_000)
    bounds = [0, *long_texts.cuts(text, 4000), len(text)]
    assert all(0 < end - start <= 4000 for start, end in zip(bounds, bounds[1:])) and len(bounds) > 13
    assert all(text[cut] in long_texts.WHITESPACE for cut in bounds[1:-1])


@pytest.mark.parametrize("spaced", [True, False])
def test_a_long_text_is_its_head_or_tail_and_its_count(tokenizer, monkeypatch, spaced):
    """Also a text without whitespace, whose cuts split what the tokenizer reads as one."""
    monkeypatch.setattr(long_texts, "PIECE_CHARS", 4000)
    text = long_text(40_000) if spaced else "".join(long_text(40_000).split())
    whole = tokenizer(text)["input_ids"]
    read = []  # the lengths of the texts the tokenizer is given

    def spy(text, **options):
        read.append(len(text))
        return tokenizer(text, **options)
    spy.num_special_tokens_to_add = tokenizer.num_special_tokens_to_add

    head, count = encode_long(spy, text, keep=300)
    assert count == len(whole) and head[:300] == whole[:300] and head[-1] == whole[-1]
    tail, tail_count = encode_long(spy, text + " the rest", keep=300, from_end=True)
    assert tail_count == len(tokenizer(text + " the rest")["input_ids"])
    assert tail[-300:] == tokenizer(text + " the rest")["input_ids"][-300:]
    assert max(read) < 6000  # never the whole text
    article = fit_article(head, tokenizer, 300, count=count)
    assert article.token_ids == tokenizer(text, truncation=True, max_length=300)["input_ids"]
    assert article.truncated_tokens == len(whole) - 300
    short = "A short text."
    assert encode_long(tokenizer, short, keep=300) == (tokenizer(short)["input_ids"], len(tokenizer(short)["input_ids"]))


def test_the_cut_keeps_the_tokenizers_closing_tokens_only(tokenizer):
    """A text ending in characters the vocabulary lacks (<unk> for Marian) or in the spelling of
    a special token loses its end, as `truncation=True` cuts it; only what the tokenizer puts
    after every text stays."""
    for end in (" ☃☃ 😀", " </s>", " <unk>"):
        text = long_text(3000) + end
        ids = tokenizer(text)["input_ids"]
        assert len(ids) > 200
        assert fit_article(ids, tokenizer, 200).token_ids == tokenizer(text, truncation=True, max_length=200)["input_ids"]
    assert closing_tokens(tokenizer) == 1  # </s> (mBART-50 puts its language code before a text)


def test_short_texts_are_not_tokenized_behind_long_ones():
    """Requests whose texts add up to more than PIECE_CHARS (one long text, or many just under
    it) queue for a thread of their own: while several hold it and its queue, a short text's
    tokenizing still runs at once."""
    from encdec.entrypoints.openai.serving_engine import tokenize_off_loop

    long = "word " * (long_texts.PIECE_CHARS // 5 + 1)
    many = ["word " * (long_texts.PIECE_CHARS // 10)] * 3
    gate = threading.Event()

    async def run():
        held = [asyncio.ensure_future(tokenize_off_loop(lambda: gate.wait(30), texts)) for texts in ([long], many, many)]
        try:
            return await asyncio.wait_for(tokenize_off_loop(lambda: "tokenized", ["a short text"]), 5)
        finally:
            gate.set()
            await asyncio.gather(*held)

    assert asyncio.run(run()) == "tokenized"
