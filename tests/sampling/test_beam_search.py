"""Beam search in the engine equals Hugging Face `generate()` with bart-large-cnn's generation config.

The checkpoint has bart-large-cnn's architecture reduced in layers and width, random weights
biased toward EOS (so hypotheses finish at different lengths and early stopping matters), and
the generation config facebook/bart-large-cnn ships.
"""
from __future__ import annotations

import pytest
import torch
from transformers import BartForConditionalGeneration, GenerationConfig

from encdec import LLM, SamplingParams
from encdec.generation_config import resolve_sampling_params
from encdec.sampling.beam_search import BeamHypothesis, BeamSearch
from tests.bart_checkpoints import BART_BASE, CORPUS, make_bart_checkpoint
from tests.conftest import assert_all_blocks_free

EOS, PAD = 2, 1
# facebook/bart-large-cnn: config.json shape, generation_config.json decoding settings.
BART_LARGE_CNN = dict(BART_BASE, vocab_size=50264, d_model=1024, encoder_layers=12,
                      decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16,
                      encoder_ffn_dim=4096, decoder_ffn_dim=4096, forced_bos_token_id=0)
CNN_GENERATION = dict(num_beams=4, length_penalty=2.0, max_length=142, min_length=56,
                      no_repeat_ngram_size=3, early_stopping=True, forced_bos_token_id=0,
                      forced_eos_token_id=2, bos_token_id=0, eos_token_id=2,
                      decoder_start_token_id=2, pad_token_id=1)
REDUCED = dict(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
               decoder_ffn_dim=256, max_position_embeddings=256)
# Shorter than the shipped 142 / 56 tokens, for test speed: max_tokens / min_tokens override them.
MAX_TOKENS, MIN_TOKENS = 39, 15


@pytest.fixture(scope="module")
def cnn_dir(tmp_path_factory):
    model_dir = make_bart_checkpoint(tmp_path_factory.mktemp("cnn"), seed=0, eos_logit_bias=5.0,
                                     **dict(BART_LARGE_CNN, **REDUCED))
    GenerationConfig(**CNN_GENERATION).save_pretrained(str(model_dir))
    return model_dir


@pytest.fixture(scope="module")
def hf_model(cnn_dir):
    return BartForConditionalGeneration.from_pretrained(str(cnn_dir)).eval()


@pytest.fixture(scope="module")
def llm(cnn_dir):
    return LLM(model=str(cnn_dir), num_gpu_blocks=512)


def texts(count: int = 8) -> list[str]:
    """Articles of different lengths."""
    return [" ".join(CORPUS[j % len(CORPUS)] for j in range(i, i + 1 + i % 4)) for i in range(count)]


@torch.inference_mode()
def hf_beam(hf_model, prompt_tokenizer, prompts: list[str], **overrides) -> list[list[list[int]]]:
    """Hugging Face's generated ids after <DEC>, per prompt and returned sequence, in one batch."""
    batch = prompt_tokenizer(prompts, return_tensors="pt", padding=True)
    n = overrides.get("num_return_sequences", 1)
    out = hf_model.generate(**batch, **overrides).tolist()
    return [[_cut(seq[1:]) for seq in out[i * n:(i + 1) * n]] for i in range(len(prompts))]


def _cut(ids: list[int]) -> list[int]:
    """Up to and including the first EOS: the rest is padding."""
    return ids[:ids.index(EOS) + 1] if EOS in ids else ids


def hf_overrides(params: SamplingParams) -> dict:
    """The same settings as Hugging Face `generate()` arguments (a decoder prompt of one token)."""
    return dict(num_beams=params.beam_width,
                early_stopping=params.early_stopping, no_repeat_ngram_size=params.no_repeat_ngram_size,
                max_length=1 + params.max_tokens, min_length=1 + params.min_tokens,
                num_return_sequences=params.n)


def run_stepwise(llm: LLM, prompts: list, params: SamplingParams) -> tuple[list, int]:
    """Drive the engine step by step, checking the block invariants after every step.

    Returns the outputs in prompt order and the largest reference count any block reached.
    """
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    finished, max_ref = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            finished[out.request_id] = out
        engine.block_manager.check_invariants()
        max_ref = max(max_ref, max(engine.block_manager.gpu_pool.ref_counts))
    return [finished[f"r{i}"] for i in range(len(prompts))], max_ref


def assert_parity(outputs, expected, min_tokens: int) -> None:
    got = [[c.token_ids for c in o.outputs] for o in outputs]
    assert got == expected
    best = [ids[0] for ids in got]
    assert len(set(map(tuple, best))) >= len(best) // 2, "outputs are nearly all identical"
    assert all(len(set(ids)) >= 3 for ids in best), "an output repeats one or two tokens"
    assert all(len(ids) >= min_tokens + 1 and ids[0] == 0 and ids[-1] == EOS for ids in best)


# Every value of each setting appears, and each pair of the three main ones.
MATRIX = [
    dict(),  # the checkpoint's own settings: 4 beams, early stopping, no 3-gram repeats
    dict(beam_width=2, early_stopping=False),
    dict(early_stopping=False, no_repeat_ngram_size=0, n=2),
    dict(beam_width=2, no_repeat_ngram_size=0),
    dict(early_stopping="never"),
]


@pytest.mark.parametrize("overrides", MATRIX,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "cnn")
def test_beam_search_matches_hugging_face(llm, hf_model, overrides):
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MIN_TOKENS, **overrides)
    prompts = texts()
    outputs, max_ref = run_stepwise(llm, prompts, params)
    engine = llm.llm_engine
    resolved = resolve_sampling_params(params, engine.generation_defaults, 1, engine.model_config.max_decoder_len)
    expected = hf_beam(hf_model, llm.get_tokenizer(), prompts, **hf_overrides(resolved))
    assert_parity(outputs, expected, MIN_TOKENS)
    assert max_ref > 1, "beams never shared a block"
    assert_all_blocks_free(llm)
    if overrides.get("n") == 2:  # the best n hypotheses, best first
        assert all(len(o.outputs) == 2 for o in outputs)


@pytest.fixture(scope="module")
def tiny_bart(tiny_bart_dir):
    return (LLM(model=str(tiny_bart_dir), num_gpu_blocks=512),
            BartForConditionalGeneration.from_pretrained(str(tiny_bart_dir)).eval())


@pytest.mark.parametrize("stop", [["e"], ["th", "a"]])
def test_stop_strings_end_hypotheses_as_in_hugging_face(tiny_bart, stop):
    """A candidate whose token completes a stop string is a finished hypothesis, as Hugging
    Face's `stop_strings` end one: `n` distinct hypotheses (they were cut after the search,
    into copies of one another)."""
    llm, hf_model = tiny_bart
    params = SamplingParams(use_beam_search=True, beam_width=3, n=3, temperature=0.0, max_tokens=20, stop=stop)
    prompts = CORPUS[:8]
    outputs, _ = run_stepwise(llm, prompts, params)
    tokenizer = llm.get_tokenizer()
    with torch.inference_mode():
        expected = [[_unpad(row[2:]) for row in hf_model.generate(
            tokenizer(prompt, return_tensors="pt")["input_ids"], decoder_input_ids=torch.tensor([[2, 0]]),
            num_beams=3, num_return_sequences=3, max_new_tokens=20, early_stopping=False,
            stop_strings=stop, tokenizer=tokenizer, min_length=0, no_repeat_ngram_size=0,
            forced_bos_token_id=None, forced_eos_token_id=None).tolist()] for prompt in prompts]
    assert [[c.token_ids for c in o.outputs] for o in outputs] == expected
    assert all(len({tuple(c.token_ids) for c in o.outputs}) == 3 for o in outputs)
    ended = [c for o in outputs for c in o.outputs if c.stop_reason in stop]
    assert len(ended) >= 3, "few hypotheses end at a stop string"
    assert all(not any(s in c.text for s in stop) for c in ended)
    assert_all_blocks_free(llm)


def _unpad(ids: list[int]) -> list[int]:
    """Without the padding after a hypothesis that a stop string ended."""
    while ids and ids[-1] == PAD:
        ids = ids[:-1]
    return ids


def test_min_length_forces_longer_outputs(llm):
    """Without min_tokens some summaries stop before MIN_TOKENS: the matrix's bound is binding."""
    free = llm.generate(texts(), SamplingParams(max_tokens=MAX_TOKENS, min_tokens=0), use_tqdm=False)
    lengths = [len(o.outputs[0].token_ids) for o in free]
    assert min(lengths) < MIN_TOKENS, lengths


def test_checkpoint_defaults_are_the_summarization_pipeline(llm, hf_model):
    """No sampling params at all: the shipped generation config, 142 / 56 tokens included."""
    prompts = texts()[:4]
    outputs = llm.generate(prompts, use_tqdm=False)
    expected = hf_beam(hf_model, llm.get_tokenizer(), prompts)
    assert_parity(outputs, expected, CNN_GENERATION["min_length"] - 1)
    assert all(o.prompt_token_ids == [EOS] for o in outputs)  # <DEC>, then the forced <BOS>
    assert_all_blocks_free(llm)


def test_parity_when_beams_are_preempted(cnn_dir, hf_model):
    llm = LLM(model=str(cnn_dir), num_gpu_blocks=48, block_size=8, swap_space=0.01)
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MIN_TOKENS)
    prompts = texts()
    outputs, max_ref = run_stepwise(llm, prompts, params)
    expected = hf_beam(hf_model, llm.get_tokenizer(), prompts, max_length=1 + MAX_TOKENS,
                       min_length=1 + MIN_TOKENS)
    assert_parity(outputs, expected, MIN_TOKENS)
    stats = llm.llm_engine.stats
    assert stats.num_swap_outs > 0 and stats.num_swap_ins == stats.num_swap_outs
    assert max_ref > 1
    assert_all_blocks_free(llm)


def test_mixed_batch_equals_each_request_alone(llm):
    """The first and last requests search with as many beams, apart in the batch: the sampler
    ranks their candidates in one call."""
    prompts = texts(7)
    params = [SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MIN_TOKENS),
              SamplingParams(temperature=0.0, max_tokens=20, no_repeat_ngram_size=2),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=20),
              SamplingParams(beam_width=2, max_tokens=25, min_tokens=0, n=2),
              SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.5),
              SamplingParams(temperature=1.0, seed=5, max_tokens=16, min_tokens=8),
              SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MIN_TOKENS)]
    together = llm.generate(prompts, params, use_tqdm=False)
    alone = [llm.generate(p, sp, use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    for a, b in zip(together, alone):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len(together[3].outputs) == 2
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("kwargs, message", [
    (dict(use_beam_search=True, temperature=0.7), "temperature must be 0"),
    (dict(beam_width=4, temperature=1.0), "temperature must be 0"),
    (dict(use_beam_search=True, beam_width=1), "beam_width >= 2"),
    (dict(use_beam_search=False, beam_width=4), "needs use_beam_search=True"),
    (dict(beam_width=0), "beam_width must be an integer >= 1"),
    (dict(beam_width=2, n=3), "n=3 must be <= beam_width=2"),
    (dict(beam_width=2, top_p=0.5), "does not sample"),
    (dict(beam_width=2, logprobs=2), "logprobs is not supported"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be an integer >= 0"),
    (dict(repetition_penalty=0.0), r"repetition_penalty must be in \[1e-30, 1e\+30\]"),
    (dict(repetition_penalty=1e-39), r"repetition_penalty must be in \[1e-30, 1e\+30\]"),  # 1 / it overflows
    (dict(early_stopping="sometimes"), "early_stopping must be True, False or 'never'"),
    (dict(early_stopping=1), "early_stopping must be True, False or 'never'"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(forced_eos_token_id=-2), "forced_eos_token_id must be a non-negative token id"),
    (dict(min_tokens=-1), "min_tokens must be an integer >= 0"),
])
def test_invalid_combinations_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_invalid_once_defaults_apply_is_refused(llm):
    """n=8 is only too many once the checkpoint's 4 beams are known; nothing is left behind."""
    with pytest.raises(ValueError, match="n=8 must be <= beam_width=4"):
        llm.generate(texts(2), SamplingParams(n=8), use_tqdm=False)
    with pytest.raises(ValueError, match="beam_width >= 2"):
        llm.generate(texts(1), SamplingParams(use_beam_search=True, temperature=0.0), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert_all_blocks_free(llm)


def test_extreme_length_penalties_rank_without_failing_the_batch(llm):
    """`length ** 1e308` overflows a float: the scores go to 0, as their limit does, instead of
    an OverflowError inside the step that would fail every request in the batch."""
    prompts = texts(2)
    params = [SamplingParams(beam_width=3, n=2, max_tokens=12, length_penalty=1e308),
              SamplingParams(beam_width=3, max_tokens=12, length_penalty=-1e308),
              SamplingParams(temperature=0.0, max_tokens=12)]
    outs = llm.generate([prompts[0], prompts[0], prompts[1]], params, use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [2, 1, 1]
    assert outs[2].outputs[0].token_ids == llm.generate(prompts[1], params[2], use_tqdm=False)[0].outputs[0].token_ids
    assert_all_blocks_free(llm)


def test_hypotheses_that_cannot_be_are_not_returned(llm):
    """One token long with forced EOS: only [EOS] is possible, so n=3 returns that one
    hypothesis, not two made of tokens scored -inf."""
    out = llm.generate(texts(1), SamplingParams(beam_width=3, n=3, max_tokens=1, forced_eos_token_id=EOS),
                       use_tqdm=False)[0]
    assert [(c.token_ids, c.cumulative_logprob) for c in out.outputs] == [([EOS], 0.0)]
    assert_all_blocks_free(llm)


def test_vllms_beam_search_api(llm):
    """`LLM.beam_search(prompts, BeamSearchParams(...))`: every beam, best first, each sequence
    the decoder prompt then the generated tokens (as vLLM's); the search is the engine's (Hugging
    Face's, above) with the params' fields and not the checkpoint's config, as vLLM's ignores it."""
    from encdec import BeamSearchParams

    prompts = texts(3)
    outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=20, length_penalty=0.5))
    expected = llm.generate(prompts, SamplingParams(beam_width=3, n=3, max_tokens=20, length_penalty=0.5,
                                                    temperature=0.0), use_tqdm=False)
    for out, want in zip(outputs, expected):
        assert [(s.tokens, s.cum_logprob, s.text, s.finish_reason) for s in out.sequences] == [
            (want.prompt_token_ids + c.token_ids, c.cumulative_logprob, c.text, c.finish_reason) for c in want.outputs]
        assert len(out.sequences) == 3
    with pytest.raises(ValueError, match="temperature must be 0"):
        llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=20, temperature=0.7))
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("rules, length_penalty, first", [
    ("hf", 1.0, "running"), ("hf", 0.0, "finished"), ("whisper", 1.0, "running")])
def test_a_search_cut_short_ranks_its_beams_as_hypotheses_of_their_length(rules, length_penalty, first):
    """An aborted search ranks each running beam by the score a hypothesis of its length would
    have: 5 tokens at -7.5 (-1.5 a token) outrank 3 finished ones at -6.0 (-2.0 a token) when the
    length counts, and not when it does not (length_penalty 0)."""
    search = BeamSearch(SamplingParams(use_beam_search=True, beam_width=2, n=2, max_tokens=10,
                                       length_penalty=length_penalty, beam_rules=rules))
    search.finished = [BeamHypothesis([1, 2, 3], -6.0 / 3 ** length_penalty, -6.0, "stop")]
    ranked = search.cut_short([([4, 5, 6, 7, 8], -7.5)], 2)
    assert [h.finish_reason for h in ranked] == (["abort", "stop"] if first == "running" else ["stop", "abort"])
    assert [h.cumulative_logprob for h in ranked if h.finish_reason == "abort"] == [-7.5]
