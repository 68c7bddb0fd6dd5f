"""Shared benchmark plumbing: one engine run per fresh process, interleaved rounds, medians.

Each engine runs in its own spawned process so its peak RSS is its own and no engine warms
the caches of the next; rounds interleave the engines so background load hits them alike.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import resource
import signal
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from encdec.entrypoints.transcribe_args import number, number_list

# the default folder of the scripts' JSON results, in the checkout whatever the working directory
RESULTS = Path(__file__).resolve().parent / "results"


def nonempty_list(item: Callable[[str], Any], expected: str) -> Callable[[str], list]:
    """An argparse type: comma-separated values of the argparse type `item`, at least one."""
    parse_all = number_list(item, expected)

    def parse(value: str) -> list:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
        return parse_all(value)
    return parse


# argparse types of the benchmarks' counts: an error names the option and the limit (exit 2)
POSITIVE = number(int, 1)
COUNT = number(int, 0)
POSITIVE_LIST = nonempty_list(POSITIVE, "comma-separated integers >= 1")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, but None (the option's help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


def script_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of `encdec bench NAME`, described by the first paragraph of the script's `doc`."""
    return argparse.ArgumentParser(prog=f"encdec bench {name}", description=doc.split("\n\n")[0],
                                   formatter_class=DefaultsHelpFormatter)


def names(known: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, at least one, each of `known`."""
    known = list(known)

    def parse(value: str) -> list[str]:
        given = [name for name in value.split(",") if name]
        if not given or not set(given) <= set(known):
            raise argparse.ArgumentTypeError(f"expected comma-separated names of {', '.join(known)}"
                                             f", got {value!r}")
        return given
    return parse


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM, the peak of its own memory since exec (on Linux
    ru_maxrss also counts the parent's memory that a spawned child had between fork and exec);
    ru_maxrss where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(fn: Callable[..., dict], args: tuple, results) -> None:
    torch.set_num_threads(args[-1])
    try:
        result = fn(*args)
        result["peak_rss_mb"] = peak_rss_mb()
        results.put(result)
    except BaseException as err:  # reported to the parent, which re-raises
        results.put({"error": f"{type(err).__name__}: {err}"})


def exit_status(code: int) -> str:
    """A process's exit code in words: a negative one is the signal that ended it."""
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def run_isolated(fn: Callable[..., dict], *args) -> dict:
    """Run `fn(*args)` in a fresh process; the last arg is the torch thread count. A child that
    dies without a result (a signal, the OOM killer) raises RuntimeError."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    load_before = os.getloadavg()[0]
    proc = ctx.Process(target=_child, args=(fn, args, results))
    proc.start()
    while True:
        alive = proc.is_alive()  # before the wait: a result put before exiting is there by then
        try:
            result = results.get(timeout=1)
            break
        except queue.Empty:
            if not alive:
                raise RuntimeError(f"{fn.__name__} died without a result "
                                   f"({exit_status(proc.exitcode)})") from None
    proc.join()
    if "error" in result:
        raise RuntimeError(f"{fn.__name__} failed: {result['error']}")
    result["load_before"] = load_before
    result["load_after"] = os.getloadavg()[0]
    return result


def interleaved(engines: dict[str, Callable[[], dict]], rounds: int, log=print) -> dict[str, list[dict]]:
    """Run every engine once per round, in the same order, and collect each run's result."""
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for r in range(rounds):
        for name, run in engines.items():
            t0 = time.perf_counter()
            result = run()
            runs[name].append(result)
            log(f"round {r + 1}/{rounds} {name}: {result['seconds']:.2f}s "
                f"(total {time.perf_counter() - t0:.1f}s, load {result['load_before']:.2f}"
                f"->{result['load_after']:.2f})")
    return runs


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


# encdec's LLM options per compute type (faster-whisper's and CTranslate2's names)
ENCDEC_COMPUTE = {"float32": {}, "bfloat16": {"dtype": "bfloat16"},
                  "float16": {"dtype": "float16"}, "int8": {"quantization": "int8"}}


def synchronize(device: str) -> None:
    """Wait for a GPU's queued work, so that a timer read next counts it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prefix_agreement(outputs: list[list], reference: list[list]) -> float:
    """The share of the reference's tokens that `outputs` repeats before its first divergence
    from it, over all requests: greedy decoding agrees exactly up to the first differing
    token, and what follows depends on it."""
    agreed = 0
    for ours, theirs in zip(outputs, reference):
        n = 0
        while n < min(len(ours), len(theirs)) and ours[n] == theirs[n]:
            n += 1
        agreed += n
    return agreed / max(1, sum(len(r) for r in reference))
