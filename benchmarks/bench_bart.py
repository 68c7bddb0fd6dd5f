"""BART greedy throughput: encdec vs Hugging Face `generate()` (static batches) vs CTranslate2.

One seeded random-weight checkpoint of the full facebook/bart-base shape; one deterministic
workload (long-tailed document lengths, per-request max_tokens, EOS ignored so every engine
produces the same number of tokens). Hugging Face runs static batches of 16 sorted by length
(its best case) and generates up to each batch's largest max_tokens; CTranslate2 runs the
same checkpoint converted by its own converter, float32, greedy, same batches.

    python -m benchmarks.bench_bart [--num-docs 64] [--rounds 2] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.common import (interleaved, machine, markdown_table, median, run_isolated,
                               write_json)

DECODER_PROMPT = [2, 0]
HF_BATCH = 16


def make_workload(num_docs: int, seed: int, vocab_size: int) -> list[dict]:
    """Long-tailed lengths in [100, 1000] tokens and max_tokens in [32, 128]."""
    rng = np.random.default_rng(seed)
    lengths = np.clip((rng.pareto(1.2, num_docs) + 1) * 100, 100, 1000).astype(int)
    max_tokens = rng.integers(32, 129, num_docs)
    return [{"ids": [0] + rng.integers(4, vocab_size - 1, n - 2).tolist() + [2], "max_tokens": int(m)}
            for n, m in zip(lengths, max_tokens)]


def make_checkpoint(out: Path, seed: int) -> Path:
    """Random facebook/bart-base with a synthetic full-size vocabulary (for CTranslate2).

    Weights are drawn with the parity tests' DEEP_INIT_STDS, so greedy outputs vary and the
    token agreement between engines means something.
    """
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizerFast

    from tests.bart_checkpoints import BART_BASE, DEEP_INIT_STDS, apply_init_stds

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(special)}
    vocab.update({f"w{i}": i for i in range(4, BART_BASE["vocab_size"] - 1)})
    vocab["<mask>"] = BART_BASE["vocab_size"] - 1
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = BartTokenizerFast(vocab=str(out / "vocab.json"), merges=str(out / "merges.txt"))
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(BartConfig(**BART_BASE)).eval()
    with torch.no_grad():
        apply_init_stds(model, DEEP_INIT_STDS)
        model.final_logits_bias.normal_(0.0, 0.05)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def convert_ct2(model_dir: Path, out: Path) -> Path:
    """CTranslate2's own converter, on a copy whose config names BART's post-LN layout."""
    if (out / "model.bin").exists():
        return out
    import ctranslate2

    staging = out.with_name(out.name + "-src")
    shutil.copytree(model_dir, staging, dirs_exist_ok=True)
    config = json.loads((staging / "config.json").read_text())
    config.update(normalize_before=False, add_final_layer_norm=False)
    (staging / "config.json").write_text(json.dumps(config))
    ctranslate2.converters.TransformersConverter(str(staging)).convert(str(out), force=True)
    shutil.rmtree(staging)
    return out


def static_batches(workload: list[dict]) -> list[list[int]]:
    order = sorted(range(len(workload)), key=lambda i: len(workload[i]["ids"]))
    return [order[i:i + HF_BATCH] for i in range(0, len(order), HF_BATCH)]


def run_encdec(model_dir: str, workload: list[dict], threads: int) -> dict:
    from encdec import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model_dir)
    prompts = [TokensPrompt(prompt_token_ids=w["ids"]) for w in workload]
    params = [SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], ignore_eos=True)
              for w in workload]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": [o.outputs[0].token_ids for o in outputs],
            "steps": llm.llm_engine.stats.num_steps}


def run_hf(model_dir: str, workload: list[dict], threads: int) -> dict:
    import torch
    from transformers import BartForConditionalGeneration

    model = BartForConditionalGeneration.from_pretrained(model_dir).eval()
    tokens: list = [None] * len(workload)
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in static_batches(workload):
            width = max(len(workload[i]["ids"]) for i in batch)
            ids = torch.full((len(batch), width), 1)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                n = len(workload[i]["ids"])
                ids[row, :n] = torch.tensor(workload[i]["ids"])
                mask[row, :n] = 1
            new = max(workload[i]["max_tokens"] for i in batch)
            out = model.generate(
                ids, attention_mask=mask, decoder_input_ids=torch.tensor([DECODER_PROMPT] * len(batch)),
                do_sample=False, num_beams=1, max_new_tokens=new, min_length=0, eos_token_id=None,
                forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0, pad_token_id=1)
            for row, i in enumerate(batch):
                tokens[i] = out[row, len(DECODER_PROMPT):len(DECODER_PROMPT) + workload[i]["max_tokens"]].tolist()
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def run_ct2(ct2_dir: str, workload: list[dict], threads: int) -> dict:
    import ctranslate2

    translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32",
                                        intra_threads=threads)
    names = [f"w{i}" for i in range(4, 50264)]
    to_tok = {i + 4: t for i, t in enumerate(names)} | {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>", 50264: "<mask>"}
    to_id = {t: i for i, t in to_tok.items()}
    tokens: list = [None] * len(workload)
    start = time.perf_counter()
    for batch in static_batches(workload):
        new = max(workload[i]["max_tokens"] for i in batch)
        results = translator.translate_batch(
            [[to_tok[t] for t in workload[i]["ids"]] for i in batch],
            target_prefix=[["<s>"]] * len(batch), beam_size=1,
            max_decoding_length=new + 1, end_token=[], max_input_length=0)
        for i, res in zip(batch, results):
            hyp = [to_id[t] for t in res.hypotheses[0]][1:]  # drops the <s> prefix (CT2 adds </s> itself)
            tokens[i] = hyp[:workload[i]["max_tokens"]]
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-docs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench")
    parser.add_argument("--engines", default="encdec,hf,ct2")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/bart.json"))
    args = parser.parse_args(argv)

    model_dir = make_checkpoint(args.work_dir / f"bart-base-deep-{args.seed}", args.seed)
    workload = make_workload(args.num_docs, args.seed, 50265)
    runners = {
        "encdec": lambda: run_isolated(run_encdec, str(model_dir), workload, args.threads),
        "hf": lambda: run_isolated(run_hf, str(model_dir), workload, args.threads),
    }
    if "ct2" in args.engines:
        ct2_dir = convert_ct2(model_dir, args.work_dir / f"bart-base-deep-{args.seed}-ct2")
        runners["ct2"] = lambda: run_isolated(run_ct2, str(ct2_dir), workload, args.threads)
    runners = {k: v for k, v in runners.items() if k in args.engines.split(",")}
    runs = interleaved(runners, args.rounds)

    generated = sum(w["max_tokens"] for w in workload)
    reference = runs["encdec"][0]["tokens"] if "encdec" in runs else None
    rows, summary = [], {}
    for name, rs in runs.items():
        secs = median(rs, "seconds")
        agree = (sum(a == b for a, b in zip(rs[0]["tokens"], reference)) / len(workload)
                 if reference is not None else float("nan"))
        summary[name] = {"seconds": secs, "tokens_per_s": generated / secs,
                         "requests_per_s": len(workload) / secs,
                         "peak_rss_mb": median(rs, "peak_rss_mb"), "agreement_with_encdec": agree,
                         "all_seconds": [r["seconds"] for r in rs],
                         "load": [(r["load_before"], r["load_after"]) for r in rs]}
        rows.append([name, secs, generated / secs, len(workload) / secs, summary[name]["peak_rss_mb"],
                     f"{agree:.0%}"])
    for name in summary:
        if name != "encdec" and "encdec" in summary:
            summary[name]["encdec_speedup"] = summary["encdec"]["tokens_per_s"] / summary[name]["tokens_per_s"]
    table = markdown_table(["engine", "wall s (median)", "gen tok/s", "req/s", "peak RSS MB",
                            "ids = encdec"], rows)
    ratios = ", ".join(f"encdec / {n}: {s['encdec_speedup']:.2f}x" for n, s in summary.items()
                       if "encdec_speedup" in s)
    variety = (float(np.median([len(set(t)) for t in reference])) if reference is not None
               else float("nan"))
    print(f"\n{args.num_docs} documents, {generated} generated tokens, {args.rounds} rounds, "
          f"{args.threads} threads; distinct tokens per output (median): {variety:g}"
          f"\n\n{table}\n\n{ratios}")
    write_json(args.json, {"machine": machine(), "args": vars(args) | {"work_dir": str(args.work_dir),
                           "json": str(args.json)}, "generated_tokens": generated, "distinct_tokens_per_output": variety,
                           "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
