"""Why lower precision parts from float32 on bench_bart's random checkpoint: its logit margins.

Greedy decoding follows float32 exactly up to the first step where a rounding error exceeds the
margin between the two best logits. This script runs bench_bart's workload on its checkpoint
with encdec float32 (asking for the top-2 log-probabilities: their difference is the logit
margin), then with bfloat16 and int8, and reports the margin quantiles, each precision's share of
tokens before its first divergence, and float32's margin at each first divergence. With
`--float64-docs N` it also checks that Hugging Face float32 and float64 agree on the first N
documents (float32 rounding alone does not decide this model's choices).

    python -m benchmarks.bart_margins [--num-docs 32] [--float64-docs 8]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.bench_bart import FAMILIES, make_workload
from benchmarks.common import ENCDEC_COMPUTE, prefix_agreement


def encdec_greedy(model_dir: str, workload: list[dict], compute: str, logprobs: int | None = None):
    from encdec import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model_dir, **ENCDEC_COMPUTE[compute])
    params = [SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], ignore_eos=True,
                             logprobs=logprobs) for w in workload]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=w["ids"]) for w in workload], params,
                           use_tqdm=False)
    return [o.outputs[0] for o in outputs]


def hf_greedy(model_dir: str, workload: list[dict], dtype) -> list[list[int]]:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=dtype).eval()
    tokens = []
    with torch.inference_mode():
        for w in workload:
            out = model.generate(torch.tensor([w["ids"]]), max_new_tokens=w["max_tokens"],
                                 min_new_tokens=w["max_tokens"], num_beams=1, do_sample=False,
                                 no_repeat_ngram_size=0)
            tokens.append(out[0, 2:].tolist())  # after the decoder start and forced BOS
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-docs", type=int, default=32)
    parser.add_argument("--float64-docs", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench")
    args = parser.parse_args()
    family = FAMILIES["bart"]
    model_dir = str(family.make_checkpoint(args.work_dir / f"{family.checkpoint}-0", 0))
    workload = make_workload(args.num_docs, 0, **family.workload)

    reference = encdec_greedy(model_dir, workload, "float32", logprobs=2)
    margins = [[abs(a.logprob - b.logprob) for a, b in (list(step.values())[:2] for step in out.logprobs)]
               for out in reference]
    flat = np.concatenate(margins)
    print(f"float32 logit margins (top-1 minus top-2), {flat.size} steps: quantiles "
          + ", ".join(f"{q:.0%} {v:.3f}" for q, v in zip((0.01, 0.05, 0.1, 0.25, 0.5),
                                                        np.quantile(flat, [0.01, 0.05, 0.1, 0.25, 0.5]))))
    ids = [out.token_ids for out in reference]
    for compute in ("bfloat16", "int8"):
        ours = [out.token_ids for out in encdec_greedy(model_dir, workload, compute)]
        parted = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), None) for o, r in zip(ours, ids)]
        at = [m[i] for m, i in zip(margins, parted) if i is not None]
        print(f"{compute}: {prefix_agreement(ours, ids):.1%} of float32's tokens before the first "
              f"divergence; float32's margin where they part: median {np.median(at):.3f}, "
              f"max {max(at):.3f} ({len(at)} of {len(ids)} outputs part)")
    if args.float64_docs:
        import torch

        part = workload[:args.float64_docs]
        agree = prefix_agreement(hf_greedy(model_dir, part, torch.float32), hf_greedy(model_dir, part, torch.float64))
        print(f"Hugging Face float32 vs float64 on {len(part)} documents: {agree:.1%} before the "
              f"first divergence")


if __name__ == "__main__":
    main()
