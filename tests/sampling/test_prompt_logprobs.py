"""vLLM's prompt_logprobs: each decoder prompt token's log-probability given the ones before it
(and the likeliest alternatives) equals Hugging Face's model output, with vLLM's ranks and
decoded tokens, in a mixed batch, streamed and after preemption by recompute."""
from __future__ import annotations

import pytest
import torch

from encdec import LLM, RequestOutputKind, SamplingParams, TokensPrompt
from tests.conftest import assert_all_blocks_free
from tests.family_checkpoints import make_family_checkpoint

ENCODER_IDS = [[0, 100, 200, 300, 2], [0, 7, 8, 9, 10, 11, 12, 2], [0, 400, 2]]
DECODER_IDS = [[2, 0, 55, 66, 77, 88], [2, 0, 31], [2]]


def prompt(i: int) -> dict:
    return {"encoder_prompt": TokensPrompt(prompt_token_ids=ENCODER_IDS[i]),
            "decoder_prompt": TokensPrompt(prompt_token_ids=DECODER_IDS[i])}


def hf_log_probs(model_dir, encoder_ids: list[int], decoder_ids: list[int]) -> torch.Tensor:
    """[len(decoder_ids), vocab]: Hugging Face's log-probabilities after each decoder token."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([encoder_ids]), decoder_input_ids=torch.tensor([decoder_ids])).logits
    return logits[0].float().log_softmax(-1)


def assert_like_hf(got, model_dir, encoder_ids: list[int], decoder_ids: list[int], num_top: int,
                   tokenizer) -> None:
    expected = hf_log_probs(model_dir, encoder_ids, decoder_ids)
    assert len(got) == len(decoder_ids) and got[0] is None
    for place, (token, entry) in enumerate(zip(decoder_ids[1:], got[1:])):
        row = expected[place]
        top = row.topk(num_top)
        assert set(entry) == set(top.indices.tolist()) | {token}
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        assert [entry[t].logprob for t in top.indices.tolist()] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [entry[t].rank for t in top.indices.tolist() if t != token] == [
            rank for rank, t in enumerate(top.indices.tolist(), start=1) if t != token]
        assert {t: e.decoded_token for t, e in entry.items()} == {t: tokenizer.decode([t]) for t in entry}


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return make_family_checkpoint("t5", tmp_path_factory.mktemp("t5"), seed=1)


@pytest.mark.parametrize("model", ["bart", "t5"])
def test_prompt_logprobs_equal_hugging_face_in_a_mixed_batch(model, tiny_bart_dir, request):
    """Greedy, sampled (n=2) and beam requests, with and without prompt_logprobs, in one batch."""
    model_dir = tiny_bart_dir if model == "bart" else request.getfixturevalue("t5_dir")
    llm = LLM(model=str(model_dir), num_gpu_blocks=128)
    decoder_start = llm.llm_engine.model_config.decoder_start_token_id
    decoders = [[decoder_start, *ids[1:]] for ids in DECODER_IDS]
    prompts = [{"encoder_prompt": TokensPrompt(prompt_token_ids=enc), "decoder_prompt": TokensPrompt(prompt_token_ids=dec)}
               for enc, dec in zip(ENCODER_IDS, decoders)]
    params = [SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=3),
              SamplingParams(temperature=1.0, n=2, seed=1, max_tokens=4, prompt_logprobs=0),
              SamplingParams(beam_width=2, max_tokens=4, prompt_logprobs=1),
              SamplingParams(temperature=0.0, max_tokens=4)]
    outputs = llm.generate([*prompts, prompts[0]], params, use_tqdm=False)
    for i, num_top in enumerate([3, 0, 1]):
        assert_like_hf(outputs[i].prompt_logprobs, model_dir, ENCODER_IDS[i], decoders[i], num_top,
                       llm.get_tokenizer())
    assert outputs[2].prompt_logprobs == [None]  # a one-token decoder prompt
    assert outputs[3].prompt_logprobs is None
    assert outputs[3].outputs[0].token_ids == outputs[0].outputs[0].token_ids  # asking changes nothing
    assert_all_blocks_free(llm)


def test_a_stream_gets_them_once_and_a_cumulative_request_every_time(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)
    engine = llm.llm_engine
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        engine.add_request(kind.name, prompt(0), SamplingParams(temperature=0.0, max_tokens=5, min_tokens=5,
                                                                prompt_logprobs=2, output_kind=kind))
    given: dict[str, list] = {"DELTA": [], "CUMULATIVE": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            given[out.request_id].append(out.prompt_logprobs)
    assert len(given["DELTA"]) == len(given["CUMULATIVE"]) == 5
    assert given["DELTA"][0] == given["CUMULATIVE"][0] and len(given["DELTA"][0]) == len(DECODER_IDS[0])
    assert given["DELTA"][1:] == [None] * 4
    assert all(entry == given["CUMULATIVE"][0] for entry in given["CUMULATIVE"])
    assert_all_blocks_free(llm)


def test_detokenize_false_leaves_the_tokens_unnamed(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=32)
    params = [SamplingParams(max_tokens=2, prompt_logprobs=1, detokenize=detokenize) for detokenize in (True, False)]
    named, unnamed = llm.generate([prompt(0)] * 2, params, use_tqdm=False)
    assert all(e.decoded_token is None for entry in unnamed.prompt_logprobs[1:] for e in entry.values())
    assert all(e.decoded_token is not None for entry in named.prompt_logprobs[1:] for e in entry.values())
    assert [{t: (e.logprob, e.rank) for t, e in entry.items()} for entry in unnamed.prompt_logprobs[1:]] == [
        {t: (e.logprob, e.rank) for t, e in entry.items()} for entry in named.prompt_logprobs[1:]]
    assert_all_blocks_free(llm)


def test_preemption_by_recompute_keeps_the_first_prefills(tiny_bart_dir):
    params = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=40, prompt_logprobs=2)
    prompts = [prompt(i % 2) for i in range(8)]
    alone = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128).generate(prompts[:2], params, use_tqdm=False)
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=14, block_size=8, preemption_mode="recompute")
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.stats.num_recomputes > 0
    for i, out in enumerate(outputs):
        expected = alone[i % 2].prompt_logprobs
        assert len(out.prompt_logprobs) == len(expected) and out.prompt_logprobs[0] is None
        for entry, wanted in zip(out.prompt_logprobs[1:], expected[1:]):
            assert entry.keys() == wanted.keys()
            assert [e.logprob for e in entry.values()] == pytest.approx([w.logprob for w in wanted.values()], abs=1e-5)
            assert [e.rank for e in entry.values()] == [w.rank for w in wanted.values()]
        assert out.outputs[0].token_ids == alone[i % 2].outputs[0].token_ids
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("value, message", [(-2, r"prompt_logprobs must be -1 \(the whole vocabulary\) or an integer >= 0, got -2"),
                                            (1.5, "prompt_logprobs must be an integer"),
                                            (1001, r"prompt_logprobs=1001 is more than the vocabulary \(vocab_size=1000\)")])
def test_bad_prompt_logprobs_name_the_field(tiny_bart_dir, value, message):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=32)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt(0), SamplingParams(prompt_logprobs=value), use_tqdm=False)
    assert_all_blocks_free(llm)
