"""Where encdec's peak RSS comes from, stage by stage: on bench_whisper's 24 short clips, or
(`--workload bart`) on bench_bart's random bart-base and 32 of its documents.

Each configuration runs in a fresh interpreter that records the resident size (VmRSS) after
each stage and the stage's own peak (VmHWM, reset between stages through
/proc/self/clear_refs): the bare interpreter, `import torch`, `import encdec`, `LLM(...)`
(weights, packing, cache set-up), and the transcription. The model's tensors are also
counted by size (the parameters and buffers, and the oneDNN packed weights), and the KV
cache by its pages resident at the end (mincore: the cache is committed as blocks get used).

    python -m benchmarks.memory_breakdown [--workload whisper|bart] [--compute float32,int8]
        [--max-num-seqs 256,8,1] [--tune-malloc] [--windows-per-pass 24]
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_MB = 1 << 20


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class Stages:
    """RSS after each stage and the peak within it (MB)."""

    def __init__(self):
        self.rows: list[dict] = []
        self.mark("python")

    def mark(self, stage: str, **extra) -> None:
        self.rows.append({"stage": stage, "rss_mb": _status_kb("VmRSS") / 1024,
                          "stage_peak_mb": _status_kb("VmHWM") / 1024, **extra})
        Path("/proc/self/clear_refs").write_text("5")  # the next stage's peak starts here


def model_tensor_mb(model) -> dict:
    """MB of `model`'s distinct parameter and buffer storages, and of its packed weights."""
    import torch

    dense, packed, seen = 0, 0, set()
    for t in list(model.parameters()) + list(model.buffers()):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            dense += t.untyped_storage().nbytes()
    for module in model.modules():
        for t in vars(module).values():
            if isinstance(t, torch.Tensor) and t.is_mkldnn:
                packed += t.numel() * t.element_size()
    return {"dense_weights_mb": dense / _MB, "packed_weights_mb": packed / _MB}


def resident_mb(tensors) -> float:
    """MB of the tensors' memory pages resident in RAM (mincore)."""
    import numpy as np

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    pages = 0
    for t in tensors:
        start = t.data_ptr() // page * page
        length = t.data_ptr() + t.untyped_storage().nbytes() - start
        vec = (ctypes.c_ubyte * ((length + page - 1) // page))()
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        pages += int((np.frombuffer(vec, np.uint8) & 1).sum())
    return pages * page / _MB


def child(workload: str, inputs: list, compute: str, max_num_seqs: int, threads: int,
          tune_malloc: bool, windows_per_pass: int | None = None) -> list[dict]:
    """The stages of one run: `inputs` are audio paths (whisper) or bench_bart's workload
    entries (bart: a checkpoint directory first)."""
    stages = Stages()
    import torch

    torch.set_num_threads(threads)
    stages.mark("import torch")
    from benchmarks.common import ENCDEC_COMPUTE
    from encdec import LLM
    from encdec.models import whisper

    if windows_per_pass:
        whisper.WINDOWS_PER_PASS = windows_per_pass
    stages.mark("import encdec")
    model = "tiny.en" if workload == "whisper" else inputs.pop(0)
    llm = LLM(model=model, max_num_seqs=max_num_seqs, tune_malloc=tune_malloc,
              **ENCDEC_COMPUTE[compute])
    stages.mark("LLM(): weights, packing, cache set-up",
                **model_tensor_mb(llm.llm_engine.model_runner.model))
    start = time.perf_counter()
    if workload == "whisper":
        texts = [r.text for r in llm.transcribe(inputs, language="en")]
    else:
        from encdec import SamplingParams, TokensPrompt

        outputs = llm.generate([TokensPrompt(prompt_token_ids=w["ids"]) for w in inputs],
                               [SamplingParams(temperature=0.0, max_tokens=w["max_tokens"], ignore_eos=True)
                                for w in inputs], use_tqdm=False)
        texts = [str(o.outputs[0].token_ids) for o in outputs]
    seconds = time.perf_counter() - start
    stages.mark(f"run {len(inputs)} inputs", seconds=seconds,
                kv_cache_resident_mb=resident_mb(llm.llm_engine.cache_engine.gpu_cache),
                texts_sha1=hashlib.sha1("\n".join(texts).encode()).hexdigest()[:12])
    return stages.rows


def run(*args) -> list[dict]:
    """`child(*args)` in a fresh interpreter."""
    args = json.dumps(args)
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory_breakdown", "--child", args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["whisper", "bart"], default="whisper")
    parser.add_argument("--compute", default="float32")
    parser.add_argument("--max-num-seqs", default="256")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tune-malloc", action="store_true", help="LLM(tune_malloc=True)")
    parser.add_argument("--windows-per-pass", type=int, help="override whisper.WINDOWS_PER_PASS")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench" / "speech")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return 0
    if args.workload == "whisper":
        from benchmarks.bench_whisper import build_corpus

        inputs = [str(p) for p, _ in build_corpus(args.work_dir)[0]]
    else:
        from benchmarks.bench_bart import FAMILIES, make_workload

        bart = FAMILIES["bart"]
        checkpoint = bart.make_checkpoint(args.work_dir.parent / f"{bart.checkpoint}-0", 0)
        inputs = [str(checkpoint), *make_workload(32, 0, **bart.workload)]
    for compute in args.compute.split(","):
        for seqs in map(int, args.max_num_seqs.split(",")):
            print(f"\n{compute}, max_num_seqs={seqs}, tune_malloc={args.tune_malloc}, "
                  f"windows_per_pass={args.windows_per_pass or 'default'}\n\n"
                  "| stage | RSS after MB | peak in stage MB | notes |\n|---|---|---|---|", flush=True)
            for row in run(args.workload, list(inputs), compute, seqs, args.threads, args.tune_malloc,
                           args.windows_per_pass):
                notes = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in row.items() if k not in ("stage", "rss_mb", "stage_peak_mb"))
                print(f"| {row['stage']} | {row['rss_mb']:.0f} | {row['stage_peak_mb']:.0f} | {notes} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
