"""Engine overhead per decode step: scheduler, prepare_inputs and sampling vs the model forward.

The real `LLMEngine.step()` runs; its phases are timed by wrapping the engine's own methods.
For each batch size, that many requests are admitted and prefilled, then decode steps are
timed (EOS ignored, so the batch stays full).

    python -m benchmarks.bench_overhead [--batch-sizes 1,32,256] [--steps 10]
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import (POSITIVE, POSITIVE_LIST, RESULTS, machine, markdown_table,
                               script_parser, write_json)
from encdec.entrypoints.transcribe_args import number

PHASES = ("schedule", "prepare_inputs", "forward", "sampling", "process_outputs")


def timed(fn, name: str, times: dict):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter() - start)
    return wrapper


def instrument(engine) -> dict[str, list[float]]:
    """Wrap the engine's phase methods (on the instances) with timers."""
    times: dict[str, list[float]] = defaultdict(list)
    runner = engine.model_runner
    engine.scheduler.schedule = timed(engine.scheduler.schedule, "schedule", times)
    runner.prepare_inputs = timed(runner.prepare_inputs, "prepare_inputs", times)
    runner.sampler = timed(runner.sampler, "sampling", times)
    engine.process_model_outputs = timed(engine.process_model_outputs, "process_outputs", times)
    model = runner.model
    model.forward = timed(model.forward, "forward", times)
    model.compute_logits = timed(model.compute_logits, "logits", times)
    return times


def measure(model_dir: str, batch_size: int, steps: int, doc_len: int, seed: int) -> dict:
    from encdec import LLM, SamplingParams, TokensPrompt
    from encdec.sampling.params import RequestOutputKind

    llm = LLM(model=model_dir, max_num_seqs=max(256, batch_size))
    engine = llm.llm_engine
    rng = np.random.default_rng(seed)
    for i in range(batch_size):
        ids = [0] + rng.integers(4, 50000, doc_len - 2).tolist() + [2]
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids),
                           SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True,
                                          output_kind=RequestOutputKind.FINAL_ONLY))
    while engine.scheduler.waiting:  # prefill everything first
        engine.step()
    engine.step()
    times = instrument(engine)
    for _ in range(steps):
        engine.step()
    assert len(times["forward"]) == steps
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    med["forward"] += med.pop("logits")
    overhead = med["schedule"] + med["prepare_inputs"] + med["sampling"]
    step = sum(med.values())
    while engine.has_unfinished_requests():
        engine.step()
    return {"batch": batch_size, **med, "overhead_ms": overhead, "step_ms": step,
            "overhead_pct": 100 * overhead / step}


def main(argv=None) -> int:
    from benchmarks.bench_bart import make_checkpoint

    parser = script_parser("overhead", __doc__)
    parser.add_argument("--batch-sizes", type=POSITIVE_LIST, default="1,32,256",
                        help="running requests, one measurement each")
    parser.add_argument("--steps", type=POSITIVE, default=10, help="decode steps timed")
    parser.add_argument("--doc-len", type=number(int, 2, 1024), default=200,
                        help="tokens per document, <s> and </s> included; at most bart-base's 1024 "
                             "positions")
    parser.add_argument("--seed", type=int, default=0, help="of the checkpoint and the documents")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench",
                        help="where the checkpoint is built once")
    parser.add_argument("--json", type=Path, default=RESULTS / "overhead.json", help="results")
    args = parser.parse_args(argv)
    model_dir = make_checkpoint(args.work_dir / f"bart-base-deep-{args.seed}", args.seed)
    rows, results = [], []
    for b in args.batch_sizes:
        r = measure(str(model_dir), b, args.steps, args.doc_len, args.seed)
        results.append(r)
        rows.append([b] + [r[p] for p in PHASES] + [r["step_ms"], f"{r['overhead_pct']:.1f}%"])
    table = markdown_table(["running requests"] + [f"{p} ms" for p in PHASES] +
                           ["step ms", "overhead (schedule+prepare+sampling)"], rows)
    print(f"\nbart-base shape, {args.doc_len}-token documents, median of {args.steps} decode steps\n\n{table}")
    write_json(args.json, {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                           "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
