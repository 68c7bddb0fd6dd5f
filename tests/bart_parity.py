"""BART parity helpers: mixed prompt batches and the comparison with Hugging Face."""
from __future__ import annotations

from transformers import BartForConditionalGeneration

from encdec import LLM, SamplingParams, TextPrompt, TokensPrompt
from tests.bart_checkpoints import CORPUS
from tests.hf_reference import NEAR_TIE, divergence_margin, hf_greedy

EOS = 2


def mixed_prompts(tokenizer, count: int = 16) -> list:
    """`count` prompts of different lengths cycling through all four prompt forms."""
    prompts = []
    for i in range(count):
        text = " ".join(CORPUS[j % len(CORPUS)] for j in range(i, i + 1 + i % 4))
        ids = tokenizer(text)["input_ids"]
        form = i % 4
        if form == 0:
            prompts.append(text)
        elif form == 1:
            prompts.append(TextPrompt(prompt=text))
        elif form == 2:
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        else:
            decoder = [None, "The summary", [0, 100 + i], [2, 0, 50 + i]][(i // 4) % 4]
            prompts.append({"encoder_prompt": TokensPrompt(prompt_token_ids=ids),
                            "decoder_prompt": decoder})
    return prompts


def run_parity(model_dir, llm: LLM, prompts, max_tokens: list[int], hf_device: str = "cpu"):
    """Run the engine on all prompts in one batch and compare each with HF (float32, on
    `hf_device`); return outputs."""
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    hf = BartForConditionalGeneration.from_pretrained(str(model_dir)).to(hf_device).eval()
    ties = []
    for i, out in enumerate(outputs):
        enc, dec, got = out.encoder_prompt_token_ids, out.prompt_token_ids, out.outputs[0].token_ids
        expected = hf_greedy(hf, enc, dec, max_tokens[i], EOS)
        if got != expected:
            margin = divergence_margin(hf, enc, dec, got, expected)
            assert margin < NEAR_TIE, f"prompt {i} differs from Hugging Face (logit margin {margin})"
            ties.append((i, margin))
    assert len(ties) <= 1, f"too many near-tie divergences: {ties}"
    return outputs


def assert_varied(outputs):
    """Random weights must still give varied, long outputs, or parity proves little."""
    seqs = [tuple(o.outputs[0].token_ids) for o in outputs]
    assert len(set(seqs)) >= len(seqs) // 2, "outputs are nearly all identical"
    assert sum(len(set(s)) > 1 for s in seqs) >= len(seqs) // 2, "outputs repeat one token"
    assert max(len(s) for s in seqs) >= 16
