"""Built-in logits processors, batched over rows, equal Hugging Face's processors row by row."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import BartForConditionalGeneration
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor, LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor, NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor)

from encdec import LLM, SamplingParams
from encdec.sampling.logits_processors import apply_logits_processors, bad_words_token_ids
from encdec.sequence import SequenceData
from tests.bart_parity import mixed_prompts
from tests.conftest import assert_all_blocks_free

VOCAB, EOS = 50, 2


def resolved(**kwargs) -> SamplingParams:
    base = dict(temperature=0.0, max_tokens=12, min_tokens=0, no_repeat_ngram_size=0,
                repetition_penalty=1.0)
    return SamplingParams(**{**base, **kwargs})


def hf_processors(params: SamplingParams, prompt_len: int) -> LogitsProcessorList:
    """Hugging Face's processors for the same settings, in `generate()`'s order."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.no_repeat_ngram_size:
        processors.append(NoRepeatNGramLogitsProcessor(params.no_repeat_ngram_size))
    if params.min_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_len, params.min_tokens, EOS))
    if params.forced_bos_token_id is not None:
        processors.append(ForcedBOSTokenLogitsProcessor(params.forced_bos_token_id))
    if params.forced_eos_token_id is not None:
        processors.append(ForcedEOSTokenLogitsProcessor(prompt_len + params.max_tokens,
                                                        params.forced_eos_token_id))
    return processors


ROWS = [  # (decoder prompt, output so far, params)
    ([2], [], resolved(forced_bos_token_id=0, forced_eos_token_id=EOS, no_repeat_ngram_size=3)),
    ([2, 0], [7, 8, 9, 7, 8], resolved(no_repeat_ngram_size=3, repetition_penalty=1.3)),
    ([2, 0], [7, 8, 7, 8, 7], resolved(no_repeat_ngram_size=2, min_tokens=9)),
    ([2], [0, 5, 5, 5], resolved(repetition_penalty=0.7, min_tokens=3)),
    ([2, 0, 11], [4] * 10, resolved(forced_eos_token_id=EOS, no_repeat_ngram_size=3,
                                    repetition_penalty=2.0, max_tokens=11)),
    ([2], [0, 3, 4, 3], resolved()),  # untouched
    ([2], [0, 1, 2, 1, 2, 1], resolved(no_repeat_ngram_size=2, repetition_penalty=1.1,
                                       min_tokens=7, forced_eos_token_id=EOS, max_tokens=7)),
    # size 1 bans every token seen, in rows of different lengths (the shorter one left-padded)
    ([2], [6], resolved(no_repeat_ngram_size=1)),
    ([2, 0, 100 % VOCAB], [9, 6, 9], resolved(no_repeat_ngram_size=1)),
]


@pytest.mark.parametrize("as_logprobs", [False, True])
def test_batched_processors_equal_hugging_face_per_row(as_logprobs):
    torch.manual_seed(0)
    scores = torch.randn(len(ROWS), VOCAB) * 3
    if as_logprobs:  # beam rows are processed as log-probabilities
        scores = torch.log_softmax(scores, dim=-1)
    expected = torch.stack([
        hf_processors(params, len(prompt))(torch.tensor([prompt + out]), scores[i:i + 1].clone())[0]
        for i, (prompt, out, params) in enumerate(ROWS)])
    got = scores.clone()
    apply_logits_processors(got, [(SequenceData(prompt, out), params) for prompt, out, params in ROWS],
                            EOS)
    assert torch.equal(got, expected)
    assert not torch.equal(got, scores)
    assert torch.equal(got[5], scores[5])
    assert got[0].isfinite().sum() == 1 and got[0, 0] == 0  # forced BOS after a lone <DEC>
    assert got[4].isfinite().sum() == 1 and got[4, EOS] == 0  # the last allowed token: EOS


def test_min_tokens_also_holds_back_stop_tokens():
    params = resolved(min_tokens=2, stop_token_ids=[9, 11])
    scores = torch.zeros(2, VOCAB)
    apply_logits_processors(scores, [(SequenceData([2], [5]), params),
                                     (SequenceData([2], [5, 6]), params)], EOS)
    assert torch.isinf(scores[0, [EOS, 9, 11]]).all() and scores[0].isfinite().sum() == VOCAB - 3
    assert scores[1].isfinite().all()


def test_request_processors_run_after_the_built_in_ones():
    seen = []

    def record(output_ids, row):
        seen.append((list(output_ids), row[EOS].item()))
        row[3] = 100.0
        return row

    params = resolved(min_tokens=5, logits_processors=[record])
    scores = torch.zeros(1, VOCAB)
    apply_logits_processors(scores, [(SequenceData([2, 0], [4]), params)], EOS)
    assert seen == [([4], -float("inf"))] and scores[0, 3] == 100.0


@torch.inference_mode()
def test_greedy_with_processors_matches_hugging_face(tiny_bart_dir):
    """Greedy rows get the processors on logits, as Hugging Face's greedy search."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)
    hf = BartForConditionalGeneration.from_pretrained(str(tiny_bart_dir)).eval()
    settings = [dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.5, min_tokens=6),
                dict(forced_bos_token_id=0, forced_eos_token_id=EOS, no_repeat_ngram_size=3),
                dict(repetition_penalty=0.8, no_repeat_ngram_size=1)]
    prompts = [p for p in mixed_prompts(llm.get_tokenizer(), count=8) if isinstance(p, str)]
    prompts = (prompts * 4)[:len(settings)]
    params = [SamplingParams(temperature=0.0, max_tokens=14, **s) for s in settings]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for out, s in zip(outputs, settings):
        hf_kwargs = {"min_new_tokens" if k == "min_tokens" else k: v for k, v in s.items()}
        expected = hf.generate(
            torch.tensor([out.encoder_prompt_token_ids]),
            decoder_input_ids=torch.tensor([out.prompt_token_ids]), do_sample=False, num_beams=1,
            max_new_tokens=14, **{"forced_eos_token_id": None, **hf_kwargs})
        assert out.outputs[0].token_ids == expected[0, len(out.prompt_token_ids):].tolist()
    assert outputs[2].prompt_token_ids == [EOS] and outputs[2].outputs[0].token_ids[0] == 0
    assert outputs[2].outputs[0].token_ids[-1] == EOS
    assert len(set(outputs[0].outputs[0].token_ids)) > 2
    assert_all_blocks_free(llm)


def test_bad_words_ban_a_word_at_the_start_and_after_a_space(tiny_bart_dir):
    """vLLM's `bad_words`: a word is banned as its own tokens and, for byte-level BPE, as its
    tokens after a space ("Ġword"), as `bad_words_ids` holding both would ban them."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=128)
    tokenizer = llm.get_tokenizer()
    vocab = tokenizer.get_vocab()
    word = next(w for w in sorted(vocab) if w.isalpha() and len(w) > 3 and f"\u0120{w}" in vocab)
    bare, spaced = vocab[word], vocab[f"\u0120{word}"]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={spaced: 40, bare: 30})
    prompt = "The rain in spain falls mainly on the plain."

    def generate(**changes) -> list[int]:
        [out] = llm.generate(prompt, dataclasses.replace(params, **changes), use_tqdm=False)
        return out.outputs[0].token_ids

    assert generate() == [spaced] * 6 and generate(bad_words_ids=[[spaced]]) == [bare] * 6
    banned = generate(bad_words=[f"  {word}"])
    assert banned == generate(bad_words_ids=[[bare], [spaced]])
    assert not {bare, spaced} & set(banned)
    assert_all_blocks_free(llm)


def test_bad_words_take_the_output_vocabulary(tmp_path):
    """A Marian tokenizer with a target vocabulary of its own bans the target side's pieces;
    SentencePiece gives a word one sequence, with or without a space before it."""
    from tests.family_checkpoints import marian_tokenizer

    tokenizer = marian_tokenizer(tmp_path, separate_vocabs=True)
    [sequence] = bad_words_token_ids(tokenizer, ["façade"])
    assert tokenizer.decode(sequence) == "façade"  # decoded with the target vocabulary
    assert sequence != tokenizer("façade", add_special_tokens=False)["input_ids"]  # the source's
    with pytest.raises(ValueError, match="bad_words: ' ' has no tokens"):
        bad_words_token_ids(tokenizer, [" "])
