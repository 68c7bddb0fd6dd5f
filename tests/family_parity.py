"""One model family's parity with Hugging Face. Each engine run takes 16 greedy requests (prompts
of different lengths in every prompt form) and 16 beam-search requests (4 beams) in one batch,
plainly and with a cache so small that requests are preempted by swap or by recompute (beam
groups always swap: their beams share one encoder prefill). Every output must equal Hugging
Face's `generate()`, every run must leave all blocks free, and the outputs must vary.

A family's test module defines a `family` fixture (a name `make_family_checkpoint` takes) and a
class deriving from `FamilyParity`; tests/models/conftest.py builds the checkpoint, the Hugging
Face reference and `decoding` (settings every request and generate() get) from it.
"""
from __future__ import annotations

import pytest

from encdec import LLM, SamplingParams, TokensPrompt
from tests.bart_checkpoints import CORPUS
from tests.bart_parity import assert_greedy_parity, assert_varied, mixed_prompts, prompt_text
from tests.conftest import assert_all_blocks_free
from tests.hf_reference import HFReference

NUM_PROMPTS = 16
GREEDY_TOKENS = [10 + (5 * i) % 13 for i in range(NUM_PROMPTS)]
BEAMS, BEAM_TOKENS = 4, 16
BLOCK_SIZE = 8
SWAP_GIB = 0.25


def beam_text(i: int) -> str:
    """Text of beam-search request i: `prompt_text(i)`, with one more sentence from the ninth
    on (prompt_text repeats after eight)."""
    return prompt_text(i) + (f" {CORPUS[(i + 3) % len(CORPUS)]}" if i >= len(CORPUS) else "")


def run_batch(model_dir, reference: HFReference, decoding: dict, **engine) -> tuple[LLM, list]:
    """One engine run of the greedy and the beam-search requests, checked against HF; returns
    the engine (for its stats) and the outputs (greedy first)."""
    llm = LLM(model=str(model_dir), block_size=BLOCK_SIZE, swap_space=SWAP_GIB,
              attention_backend="torch", **engine)
    tokenizer = llm.get_tokenizer()
    start = llm.llm_engine.model_config.decoder_start_token_id
    greedy = mixed_prompts(tokenizer, NUM_PROMPTS, decoder_start=start)
    beams = [TokensPrompt(prompt_token_ids=tokenizer(beam_text(i))["input_ids"])
             for i in range(NUM_PROMPTS)]
    beam_params = SamplingParams(use_beam_search=True, beam_width=BEAMS, temperature=0.0,
                                 max_tokens=BEAM_TOKENS, **decoding)
    requests = [(g, SamplingParams(temperature=0.0, max_tokens=m, **decoding))
                for g, m in zip(greedy, GREEDY_TOKENS)] + [(b, beam_params) for b in beams]
    order = [i for pair in zip(range(NUM_PROMPTS), range(NUM_PROMPTS, 2 * NUM_PROMPTS)) for i in pair]
    mixed = llm.generate([requests[i][0] for i in order], [requests[i][1] for i in order],
                         use_tqdm=False)  # greedy and beam requests take turns in the queue
    outputs = [out for _, out in sorted(zip(order, mixed), key=lambda pair: pair[0])]
    assert_greedy_parity(outputs[:NUM_PROMPTS], GREEDY_TOKENS, reference, **decoding)
    expected = reference.beam_search([o.encoder_prompt_token_ids for o in outputs[NUM_PROMPTS:]],
                                     BEAMS, BEAM_TOKENS, **decoding)
    assert [o.outputs[0].token_ids for o in outputs[NUM_PROMPTS:]] == expected
    assert_varied(outputs[:NUM_PROMPTS])
    assert_varied(outputs[NUM_PROMPTS:])
    assert_all_blocks_free(llm)
    return llm, outputs


def small_cache(outputs) -> int:
    """An eighth of the blocks all requests need at once (but room for the largest alone):
    requests are admitted on what their prompts need, and preempted as they grow."""
    def blocks(n: int) -> int:
        return -(-n // BLOCK_SIZE)

    needs = [blocks(len(o.encoder_prompt_token_ids)) + blocks(len(o.prompt_token_ids) + m)
             for o, m in zip(outputs, GREEDY_TOKENS)]
    needs += [blocks(len(o.encoder_prompt_token_ids)) + BEAMS * blocks(len(o.prompt_token_ids) + BEAM_TOKENS)
              for o in outputs[NUM_PROMPTS:]]
    return max(2 + max(needs), sum(needs) // 8)


class FamilyParity:
    def test_greedy_and_beam_search_match_hugging_face(self, plain_outputs):
        assert len(plain_outputs) == 2 * NUM_PROMPTS

    @pytest.mark.parametrize("mode", ["swap", pytest.param("recompute", marks=pytest.mark.extended)])
    def test_parity_under_preemption(self, family_dir, reference, decoding, plain_outputs, mode):
        llm, _ = run_batch(family_dir, reference, decoding, preemption_mode=mode,
                           num_gpu_blocks=small_cache(plain_outputs))
        stats = llm.llm_engine.stats
        assert stats.num_preemptions > 0 and stats.num_swap_outs == stats.num_swap_ins
        # swapped groups keep their cross blocks; recomputed ones run the encoder again, once
        # for each of their sequences (a beam search's are recomputed too)
        if mode == "swap":
            assert stats.num_swap_outs > 0 and stats.num_recomputes == 0
            assert stats.num_encoder_runs == 2 * NUM_PROMPTS
        else:
            assert stats.num_recomputes > 0
            assert stats.num_encoder_runs >= 2 * NUM_PROMPTS + stats.num_recomputes

    @pytest.mark.parametrize("precision", [{"dtype": "bfloat16"}, {"quantization": "int8"}],
                             ids=["bfloat16", "int8"])
    def test_lower_precision_runs_the_family(self, family_dir, decoding, plain_outputs, precision):
        """bfloat16 and int8 run every part of the family (T5's position bias in paged decode,
        beams) to the requested lengths, with all blocks free after. Their ids are only checked
        against garbage (which would agree on about none): on these random weights any lower
        precision, Hugging Face's own included, parts from float32 early (Flan-T5's bfloat16
        logits are off by up to 8 in Hugging Face too). Measured on an AVX-512 EPYC, of 32 first
        tokens equal to float32's: bfloat16 21-31, int8 7-31; Flan-T5's int8 is the 7, its large
        activations losing most, with inputs of 8 bits (VNNI) as of 7 (AVX2 only,
        `cpu_int8_linear`). Accuracy is gated on real weights (Whisper's WER,
        tests/whisper/test_low_precision.py) and on BART's agreement
        (tests/models/test_quantization.py)."""
        llm = LLM(model=str(family_dir), num_gpu_blocks=2048, **precision)
        prompts = [{"encoder_prompt": TokensPrompt(prompt_token_ids=o.encoder_prompt_token_ids),
                    "decoder_prompt": TokensPrompt(prompt_token_ids=o.prompt_token_ids)}
                   for o in plain_outputs]
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, **decoding)
                  for m in GREEDY_TOKENS] + [SamplingParams(
                      use_beam_search=True, beam_width=BEAMS, temperature=0.0,
                      max_tokens=BEAM_TOKENS, ignore_eos=True, **decoding)] * NUM_PROMPTS
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
        firsts = sum(o.outputs[0].token_ids[0] == p.outputs[0].token_ids[0]
                     for o, p in zip(outputs, plain_outputs))
        print(f"{precision}: {firsts} of {len(outputs)} first tokens equal float32's")
        assert firsts >= len(outputs) / (6 if "quantization" in precision else 3)
        assert_all_blocks_free(llm)
