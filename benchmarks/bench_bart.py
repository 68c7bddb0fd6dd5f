"""Greedy throughput of BART or T5: encdec vs Hugging Face `generate()` (static batches) vs
CTranslate2.

One seeded random-weight checkpoint of a full published shape (`--family bart`: facebook/bart-base;
`--family t5`: google-t5/t5-small with its 32128-id vocabulary); one deterministic workload
(long-tailed document lengths, per-request max_tokens, EOS ignored so every engine produces the
same number of tokens). Hugging Face runs static batches of 16 sorted by length (its best case)
and generates up to each batch's largest max_tokens; CTranslate2 runs the same checkpoint
converted by its own converter, float32, greedy, same batches.

    python -m benchmarks.bench_bart [--family t5] [--num-docs 64] [--rounds 2] [--threads 2]

On a GPU, `--device cuda` runs encdec and Hugging Face there (`encdec-fp16` and `hf-fp16` in
float16; `--attention-backend xformers` for encdec's xformers kernels).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.common import (ENCDEC_COMPUTE, POSITIVE, RESULTS, interleaved, machine,
                               markdown_table, median, names, prefix_agreement, run_isolated,
                               script_parser, synchronize, write_json)
from encdec.entrypoints.cli_args import device_name

DECODER_PROMPT = [2, 0]
HF_BATCH = 16
T5_VOCAB_SIZE = 32128


def make_workload(num_docs: int, seed: int, vocab_size: int, max_len: int = 1000,
                  encoder_bos: tuple[int, ...] = (0,), eos: int = 2,
                  first_id: int = 4) -> list[dict]:
    """Long-tailed lengths in [100, max_len] tokens (`encoder_bos`, random ids from `first_id`
    below the vocabulary's last, `eos`) and max_tokens in [32, 128]."""
    rng = np.random.default_rng(seed)
    lengths = np.clip((rng.pareto(1.2, num_docs) + 1) * 100, 100, max_len).astype(int)
    max_tokens = rng.integers(32, 129, num_docs)
    body = len(encoder_bos) + 1
    return [{"ids": [*encoder_bos, *rng.integers(first_id, vocab_size - 1, n - body).tolist(), eos],
             "max_tokens": int(m)} for n, m in zip(lengths, max_tokens)]


def make_checkpoint(out: Path, seed: int) -> Path:
    """Random facebook/bart-base with a synthetic full-size vocabulary (for CTranslate2).

    Weights are drawn with the parity tests' DEEP_INIT_STDS, so greedy outputs vary and the
    token agreement between engines means something.
    """
    from transformers import BartTokenizerFast

    from tests.bart_checkpoints import BART_BASE, DEEP_INIT_STDS, make_bart_checkpoint

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
    return make_bart_checkpoint(out, seed, init_stds=DEEP_INIT_STDS, tokenizer=tokenizer, **BART_BASE)


def make_t5_checkpoint(out: Path, seed: int) -> Path:
    """Random google-t5/t5-small (6 + 6 layers, tied LM head) with the parity tests' weight stds
    and SentencePiece tokenizer; the vocabulary is t5-small's 32128 ids (CTranslate2 names the
    ids past the tokenizer's pieces <extra_id_N>, so the tokenizer has no sentinels of its own)."""
    from tests.family_checkpoints import make_family_checkpoint, t5_tokenizer

    if (out / "config.json").exists():
        return out
    tokenizer = t5_tokenizer(out / "_spm", extra_ids=0)
    return make_family_checkpoint("t5", out, seed=seed, full=True, tokenizer=tokenizer,
                                  vocab_size=T5_VOCAB_SIZE)


@dataclass(frozen=True)
class Family:
    """What the engines need to know of a model family's checkpoint."""

    checkpoint: str  # its folder name in --work-dir
    make_checkpoint: Callable[[Path, int], Path]
    workload: dict  # make_workload's settings
    decoder_prompt: list[int]  # the decoder start token, then any forced prefix
    pad_id: int
    ct2_config: dict  # config.json changes CTranslate2's converter needs


FAMILIES = {
    "bart": Family("bart-base-deep", make_checkpoint, dict(vocab_size=50265), DECODER_PROMPT,
                   pad_id=1, ct2_config=dict(normalize_before=False, add_final_layer_norm=False)),
    # T5 has no absolute positions and was trained on (and encdec limits inputs to) 512 tokens
    "t5": Family("t5-small", make_t5_checkpoint,
                 dict(vocab_size=T5_VOCAB_SIZE, max_len=512, encoder_bos=(), eos=1, first_id=3),
                 [0], pad_id=0, ct2_config={}),
}


def convert_ct2(model_dir: Path, out: Path, config_changes: dict) -> Path:
    """CTranslate2's own converter, on a copy of the checkpoint with `config_changes` (BART's
    post-LN layout)."""
    if (out / "model.bin").exists():
        return out
    import ctranslate2

    staging = out.with_name(out.name + "-src")
    shutil.copytree(model_dir, staging, dirs_exist_ok=True)
    config = json.loads((staging / "config.json").read_text())
    config.update(config_changes)
    (staging / "config.json").write_text(json.dumps(config))
    ctranslate2.converters.TransformersConverter(str(staging)).convert(str(out), force=True)
    shutil.rmtree(staging)
    return out


def device(value: str) -> str:
    """An argparse type: cpu, cuda or cuda:N (Hugging Face's models take no auto)."""
    if value == "auto":
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {value!r}")
    return device_name(value)


def static_batches(workload: list[dict]) -> list[list[int]]:
    order = sorted(range(len(workload)), key=lambda i: len(workload[i]["ids"]))
    return [order[i:i + HF_BATCH] for i in range(0, len(order), HF_BATCH)]


def run_encdec(model_dir: str, workload: list[dict], compute: str, device: str, backend: str | None,
               threads: int) -> dict:
    from encdec import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model_dir, device=device, attention_backend=backend, **ENCDEC_COMPUTE[compute])
    prompts = [TokensPrompt(prompt_token_ids=w["ids"]) for w in workload]
    params = [SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], ignore_eos=True)
              for w in workload]
    if device != "cpu":  # GPU kernels load on first use: one short untimed run first
        llm.generate(prompts[:8], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    steps = llm.llm_engine.stats.num_steps
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": [o.outputs[0].token_ids for o in outputs],
            "steps": llm.llm_engine.stats.num_steps - steps}


def run_hf(model_dir: str, workload: list[dict], family: str, dtype: str, device: str,
           threads: int) -> dict:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    decoder_prompt, pad_id = FAMILIES[family].decoder_prompt, FAMILIES[family].pad_id
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    model.to(device)
    tokens: list = [None] * len(workload)

    def generate(batch: list[int], max_tokens: int):
        width = max(len(workload[i]["ids"]) for i in batch)
        ids = torch.full((len(batch), width), pad_id)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            n = len(workload[i]["ids"])
            ids[row, :n] = torch.tensor(workload[i]["ids"])
            mask[row, :n] = 1
        return model.generate(
            ids.to(device), attention_mask=mask.to(device),
            decoder_input_ids=torch.tensor([decoder_prompt] * len(batch), device=device),
            do_sample=False, num_beams=1, max_new_tokens=max_tokens, min_length=0,
            eos_token_id=None, forced_bos_token_id=None, forced_eos_token_id=None,
            no_repeat_ngram_size=0, pad_token_id=pad_id)

    with torch.inference_mode():
        if device != "cpu":  # GPU kernels load on first use: one short untimed run first
            generate(list(range(min(8, len(workload)))), 4)
        start = time.perf_counter()
        for batch in static_batches(workload):
            out = generate(batch, max(workload[i]["max_tokens"] for i in batch))
            for row, i in enumerate(batch):
                first = len(decoder_prompt)
                tokens[i] = out[row, first:first + workload[i]["max_tokens"]].tolist()
    synchronize(device)
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def run_ct2(ct2_dir: str, workload: list[dict], family: str, compute_type: str,
            threads: int) -> dict:
    """CTranslate2 starts the decoder with the start token of its config itself; the rest of
    the decoder prompt (BART's <s>) is a target prefix, dropped from its outputs."""
    import ctranslate2

    translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=compute_type,
                                        intra_threads=threads)
    names = json.loads((Path(ct2_dir) / "shared_vocabulary.json").read_text())
    to_id = {name: i for i, name in enumerate(names)}
    prefix = [names[i] for i in FAMILIES[family].decoder_prompt[1:]]
    tokens: list = [None] * len(workload)
    start = time.perf_counter()
    for batch in static_batches(workload):
        new = max(workload[i]["max_tokens"] for i in batch)
        results = translator.translate_batch(
            [[names[t] for t in workload[i]["ids"]] for i in batch],
            target_prefix=[prefix] * len(batch) if prefix else None, beam_size=1,
            max_decoding_length=new + len(prefix), end_token=[], max_input_length=0)
        for i, res in zip(batch, results):
            hyp = [to_id[t] for t in res.hypotheses[0]][len(prefix):]
            tokens[i] = hyp[:workload[i]["max_tokens"]]
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


# engine name -> its precision
ENCDEC_RUNS = {"encdec": "float32", "encdec-bf16": "bfloat16", "encdec-fp16": "float16",
               "encdec-int8": "int8"}
HF_RUNS = {"hf": "float32", "hf-fp16": "float16"}
CT2_RUNS = {"ct2": "float32", "ct2-int8": "int8"}
ENGINES = (*ENCDEC_RUNS, *HF_RUNS, *CT2_RUNS)


def main(argv=None) -> int:
    parser = script_parser("bart", __doc__)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="bart", help="the checkpoint's shape")
    parser.add_argument("--num-docs", type=POSITIVE, default=64, help="documents in the workload")
    parser.add_argument("--rounds", type=POSITIVE, default=2, help="runs of each engine, interleaved")
    parser.add_argument("--threads", type=POSITIVE, default=2, help="each engine's torch threads")
    parser.add_argument("--seed", type=int, default=0, help="of the checkpoint and the workload")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench",
                        help="where the checkpoints are built once")
    parser.add_argument("--engines", type=names(ENGINES), default="encdec,hf,ct2",
                        help=f"of {', '.join(ENGINES)}")
    parser.add_argument("--device", type=device, default="cpu",
                        help="encdec's and Hugging Face's: cpu, cuda or cuda:N")
    parser.add_argument("--attention-backend", choices=["torch", "xformers"],
                        help="encdec's (default: the selector's choice)")
    parser.add_argument("--json", type=Path, help=f"results (default: {RESULTS}/FAMILY.json)")
    args = parser.parse_args(argv)
    args.json = args.json or RESULTS / f"{args.family}.json"

    family = FAMILIES[args.family]
    model_dir = family.make_checkpoint(args.work_dir / f"{family.checkpoint}-{args.seed}", args.seed)
    workload = make_workload(args.num_docs, args.seed, **family.workload)
    runners = {name: lambda c=compute: run_isolated(run_encdec, str(model_dir), workload, c,
                                                    args.device, args.attention_backend,
                                                    args.threads)
               for name, compute in ENCDEC_RUNS.items()}
    runners |= {name: lambda d=dtype: run_isolated(run_hf, str(model_dir), workload, args.family, d,
                                                   args.device, args.threads)
                for name, dtype in HF_RUNS.items()}
    if set(CT2_RUNS) & set(args.engines):
        ct2_dir = convert_ct2(model_dir, args.work_dir / f"{family.checkpoint}-{args.seed}-ct2",
                              family.ct2_config)
        for name, compute_type in CT2_RUNS.items():
            runners[name] = lambda c=compute_type: run_isolated(run_ct2, str(ct2_dir), workload,
                                                                args.family, c, args.threads)
    runners = {k: v for k, v in runners.items() if k in args.engines}
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
                         "prefix_agreement_with_encdec": (
                             prefix_agreement(rs[0]["tokens"], reference)
                             if reference is not None else float("nan")),
                         "all_seconds": [r["seconds"] for r in rs],
                         "load": [(r["load_before"], r["load_after"]) for r in rs]}
        rows.append([name, secs, generated / secs, len(workload) / secs, summary[name]["peak_rss_mb"],
                     f"{agree:.0%}", f"{summary[name]['prefix_agreement_with_encdec']:.1%}"])
    for name in summary:
        if name != "encdec" and "encdec" in summary:
            summary[name]["encdec_speedup"] = summary["encdec"]["tokens_per_s"] / summary[name]["tokens_per_s"]
    table = markdown_table(["engine", "wall s (median)", "gen tok/s", "req/s", "peak RSS MB",
                            "ids = encdec", "tokens before divergence"], rows)
    ratios = ", ".join(f"encdec / {n}: {s['encdec_speedup']:.2f}x" for n, s in summary.items()
                       if "encdec_speedup" in s)
    ratios += "".join(f", {ours} / {theirs}: "
                      f"{summary[ours]['tokens_per_s'] / summary[theirs]['tokens_per_s']:.2f}x"
                      for ours, theirs in (("encdec-bf16", "ct2-int8"), ("encdec-int8", "ct2-int8"))
                      if ours in summary and theirs in summary)
    variety = (float(np.median([len(set(t)) for t in reference])) if reference is not None
               else float("nan"))
    print(f"\n{args.family}: {args.num_docs} documents, {generated} generated tokens, {args.rounds} rounds, "
          f"{args.threads} threads; distinct tokens per output (median): {variety:g}"
          f"\n\n{table}\n\n{ratios}")
    write_json(args.json, {"machine": machine(), "args": vars(args) | {"work_dir": str(args.work_dir),
                           "json": str(args.json)}, "generated_tokens": generated, "distinct_tokens_per_output": variety,
                           "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
