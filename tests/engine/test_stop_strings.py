"""Stop strings in the engine, by vLLM's rules: a completion ends at the first stop string that
ends in the text of a token after its first `min_tokens`; its text stops before it (or after,
with `include_stop_str_in_output`), its token ids end with the token that completed it, its
blocks are freed at once, and streamed pieces never show a stop string's start. Expected texts
come from the tokenizer's own decode of the unstopped greedy completion's prefixes."""
from __future__ import annotations

from typing import Optional

import pytest

from encdec import LLM, RequestOutputKind, SamplingParams
from tests.conftest import assert_all_blocks_free

TEXT = "The rain in spain falls mainly on the plain."
LONG = dict(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_bart_dir):
    return LLM(model=str(tiny_bart_dir), num_gpu_blocks=200, block_size=8)


@pytest.fixture(scope="module")
def reference(llm) -> list[int]:
    (out,) = llm.generate(TEXT, SamplingParams(**LONG), use_tqdm=False)
    return out.outputs[0].token_ids


def expected(llm, ids: list[int], stops: list[str], include: bool = False,
             min_tokens: int = 0) -> tuple[str, int, Optional[str]]:
    """(text, tokens, stop string) from the prefixes' decodes: the first token whose prefix
    shows a stop string ending after the first `min_tokens` tokens' text."""
    prefix = [llm.llm_engine.tokenizer.decode(ids[:m], skip_special_tokens=True) for m in range(len(ids) + 1)]
    floor = len(prefix[min_tokens])
    for m in range(min_tokens + 1, len(ids) + 1):
        found = [(prefix[m].find(s, max(floor - len(s) + 1, 0)), i) for i, s in enumerate(stops)]
        found = [(at, i) for at, i in found if at >= 0]
        if found:
            at, i = min(found)
            return prefix[m][:at + len(stops[i]) * include], m, stops[i]
    return prefix[-1], len(ids), None


def generate(llm, **params):
    (out,) = llm.generate(TEXT, SamplingParams(**LONG, **params), use_tqdm=False)
    assert_all_blocks_free(llm)
    return out.outputs[0]


def spanning_stop(llm, ids: list[int], k: int) -> str:
    """Three characters around the end of the first k tokens' text (a stop string over two tokens)."""
    end = len(llm.llm_engine.tokenizer.decode(ids[:k], skip_special_tokens=True))
    return llm.llm_engine.tokenizer.decode(ids, skip_special_tokens=True)[end - 1:end + 2]


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("min_tokens", [0, 3])
def test_stop_string_ends_the_completion(llm, reference, include, min_tokens):
    stop = spanning_stop(llm, reference, 2)
    text, num_tokens, hit = expected(llm, reference, [stop], include, min_tokens)
    assert hit == stop and num_tokens < len(reference)  # the cases stop early
    out = generate(llm, stop=stop, include_stop_str_in_output=include, min_tokens=min_tokens)
    assert (out.text, out.token_ids) == (text, reference[:num_tokens])
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_the_earliest_of_several_stop_strings_wins(llm, reference):
    full = llm.llm_engine.tokenizer.decode(reference, skip_special_tokens=True)
    stops = [spanning_stop(llm, reference, 6), full[len(full) // 3:][:2], "never in the text"]
    text, num_tokens, hit = expected(llm, reference, stops)
    out = generate(llm, stop=stops)
    assert (out.text, out.token_ids, out.stop_reason) == (text, reference[:num_tokens], hit)
    untouched = generate(llm, stop="never in the text")
    assert (untouched.token_ids, untouched.finish_reason, untouched.stop_reason) == (reference, "length", None)


@pytest.mark.parametrize("shorter", [[], ["\u00a7"]])  # with a 1-character stop string that never comes
@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_streamed_text_never_shows_a_stop_strings_start(llm, reference, kind, shorter):
    stop = spanning_stop(llm, reference, 4)
    text, num_tokens, _ = expected(llm, reference, [stop])
    engine = llm.llm_engine
    engine.add_request("streamed", TEXT, SamplingParams(**LONG, stop=[*shorter, stop], output_kind=kind))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o.outputs[0] for o in engine.step()]
    assert_all_blocks_free(llm)
    texts = ([o.text for o in outputs] if kind is RequestOutputKind.CUMULATIVE
             else ["".join(o.text for o in outputs[:i + 1]) for i in range(len(outputs))])
    assert texts[-1] == text and all(text.startswith(t) for t in texts)
    assert outputs[-1].finish_reason == "stop" and outputs[-1].stop_reason == stop
    ids = (outputs[-1].token_ids if kind is RequestOutputKind.CUMULATIVE
           else [t for o in outputs for t in o.token_ids])
    assert ids == reference[:num_tokens]


def test_beam_search_hypotheses_end_at_their_stop_string(llm):
    """A hypothesis ends with the token that completed a stop string (the search's parity with
    Hugging Face: tests/sampling/test_beam_search.py); its text stops before the string."""
    beams = dict(use_beam_search=True, beam_width=3, n=2, max_tokens=24)
    (plain,) = llm.generate(TEXT, SamplingParams(**beams), use_tqdm=False)
    stop = plain.outputs[0].text[3:5]
    (cut,) = llm.generate(TEXT, SamplingParams(**beams, stop=stop), use_tqdm=False)
    assert_all_blocks_free(llm)
    tokenizer = llm.get_tokenizer()
    assert any(out.stop_reason == stop for out in cut.outputs)
    for out in cut.outputs:
        whole = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        if out.stop_reason == stop:
            assert out.finish_reason == "stop" and out.text == whole[:whole.find(stop)]
            assert stop not in tokenizer.decode(out.token_ids[:-1], skip_special_tokens=True)
        else:
            assert stop not in out.text


def test_each_sample_stops_on_its_own(llm):
    (out,) = llm.generate(TEXT, SamplingParams(temperature=1.0, seed=5, n=4, max_tokens=24, stop=["e", "a"]),
                          use_tqdm=False)
    assert_all_blocks_free(llm)
    for completion in out.outputs:
        assert "e" not in completion.text and "a" not in completion.text
        if completion.finish_reason == "stop":
            assert completion.stop_reason in ("e", "a")
            full = llm.llm_engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            assert full.startswith(completion.text) and full[len(completion.text)] == completion.stop_reason


def test_stop_token_ids_are_the_stop_reason(llm, reference):
    token = reference[5]
    out = generate(llm, stop_token_ids=[token])
    assert out.token_ids == reference[:reference.index(token) + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", token)


@pytest.mark.parametrize("stop, message", [("", "stop cannot contain an empty string"),
                                           (["a", ""], "stop cannot contain an empty string"),
                                           ([1], "stop must be a string or a list of strings")])
def test_bad_stop_strings(stop, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(stop=stop)
