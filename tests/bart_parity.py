"""Parity helpers for text models (BART and the other families): mixed prompt batches and the
greedy comparison with Hugging Face."""
from __future__ import annotations

from encdec import LLM, SamplingParams, TextPrompt, TokensPrompt
from tests.bart_checkpoints import CORPUS
from tests.hf_reference import NEAR_TIE, HFReference, divergence_margin

EOS = 2


def prompt_text(i: int) -> str:
    """Text of prompt i: one to four CORPUS sentences."""
    return " ".join(CORPUS[j % len(CORPUS)] for j in range(i, i + 1 + i % 4))


def mixed_prompts(tokenizer, count: int = 16, decoder_start: int = 2) -> list:
    """`count` prompts of different lengths cycling through all four prompt forms; the
    explicit decoder prompts include one that already starts with `decoder_start` (<DEC>)."""
    prompts = []
    for i in range(count):
        text = prompt_text(i)
        ids = tokenizer(text)["input_ids"]
        form = i % 4
        if form == 0:
            prompts.append(text)
        elif form == 1:
            prompts.append(TextPrompt(prompt=text))
        elif form == 2:
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        else:
            decoder = [None, "The summary", [0, 100 + i], [decoder_start, 0, 50 + i]][(i // 4) % 4]
            prompts.append({"encoder_prompt": TokensPrompt(prompt_token_ids=ids),
                            "decoder_prompt": decoder})
    return prompts


def run_parity(model_dir, llm: LLM, prompts, max_tokens: list[int], hf_device: str = "cpu",
               reference: HFReference | None = None, **params):
    """Run the engine greedily on all prompts in one batch and compare each with HF (a
    `reference`, else one loaded from `model_dir` on `hf_device`); `params` (e.g.
    forced_bos_token_id) go to every request and to HF's generate(). Returns the outputs."""
    outputs = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=m, **params)
                                     for m in max_tokens], use_tqdm=False)
    assert_greedy_parity(outputs, max_tokens, reference or HFReference(model_dir, hf_device),
                         **params)
    return outputs


def assert_greedy_parity(outputs, max_tokens: list[int], reference: HFReference, **params) -> None:
    """Each greedy output equals HF's, but for at most one parting at a near tie."""
    ties = []
    for i, out in enumerate(outputs):
        enc, dec, got = out.encoder_prompt_token_ids, out.prompt_token_ids, out.outputs[0].token_ids
        expected = reference.greedy(enc, dec, max_tokens[i], **params)
        if got != expected:
            margin = divergence_margin(reference.model, enc, dec, got, expected)
            assert margin < NEAR_TIE, f"prompt {i} differs from Hugging Face (logit margin {margin})"
            ties.append((i, margin))
    assert len(ties) <= 1, f"too many near-tie divergences: {ties}"


def assert_varied(outputs):
    """Random weights must still give varied, long outputs, or parity proves little."""
    seqs = [tuple(o.outputs[0].token_ids) for o in outputs]
    assert len(set(seqs)) >= len(seqs) // 2, "outputs are nearly all identical"
    assert sum(len(set(s)) > 1 for s in seqs) >= len(seqs) // 2, "outputs repeat one token"
    assert max(len(s) for s in seqs) >= 16
