"""Start-up time: `encdec transcribe FILE` from launch to its first output line, and `import encdec`.

Each run is a fresh process. The first run gets an empty Numba cache (NUMBA_CACHE_DIR in a new
temporary folder), as right after an install without `encdec warmup`, so it includes compiling
the decode kernel; then `encdec warmup` fills another empty cache, as the README's set-up does,
and one run follows on it. The warm runs reuse the package's cache (filled by `encdec warmup`
first). Reported: those two runs, the warmup's time, the median (and all) of the warm runs, and
`import encdec`.

    python -m benchmarks.bench_startup [--runs 5] [--file samples/hello.wav] [-- extra CLI args]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import POSITIVE, RESULTS, machine, write_json


def first_line_seconds(command: list[str], env: dict) -> tuple[float, float, str]:
    """(seconds to the first stdout line, seconds to exit, that line) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stdout.readline()
    first = time.perf_counter() - start
    proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}")
    return first, time.perf_counter() - start, line.strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=POSITIVE, default=5)
    parser.add_argument("--file", default="samples/hello.wav")
    parser.add_argument("--json", type=Path, default=RESULTS / "startup.json")
    parser.add_argument("extra", nargs="*", help="more `encdec transcribe` arguments")
    args = parser.parse_args(argv)

    command = [sys.executable, "-m", "encdec", "transcribe", args.file, *args.extra]
    warmup = [sys.executable, "-m", "encdec", "warmup"]
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as cold_cache:
        first = first_line_seconds(command, dict(os.environ, NUMBA_CACHE_DIR=cold_cache))
    with tempfile.TemporaryDirectory() as fresh_cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=fresh_cache)
        warmup_s = first_line_seconds(warmup, env)[1]
        after_warmup = first_line_seconds(command, env)
    first_line_seconds(warmup, dict(os.environ))
    warm = [first_line_seconds(command, dict(os.environ)) for _ in range(args.runs)]
    imports = [first_line_seconds([sys.executable, "-c", "import encdec; print('ok')"],
                                  dict(os.environ))[0] for _ in range(args.runs)]
    result = {"first_run_s": first[0], "warmup_s": warmup_s,
              "first_run_after_warmup_s": after_warmup[0], "warm_first_line_s": [w[0] for w in warm],
              "warm_median_s": statistics.median(w[0] for w in warm),
              "warm_exit_median_s": statistics.median(w[1] for w in warm),
              "import_encdec_median_s": statistics.median(imports), "first_line": warm[0][2],
              "load_at_start": load_at_start, "load": os.getloadavg()}
    print(f"{' '.join(command[1:])}: first output line after {result['warm_median_s']:.2f} s "
          f"(median of {args.runs} warm runs: {', '.join(f'{w[0]:.2f}' for w in warm)}); "
          f"first run with a cold kernel cache {first[0]:.2f} s; first run after `encdec warmup` "
          f"({warmup_s:.1f} s) {after_warmup[0]:.2f} s; `import encdec` "
          f"{result['import_encdec_median_s']:.2f} s; load {load_at_start[0]:.2f} at the start, "
          f"{result['load'][0]:.2f} at the end\n"
          f"first line: {result['first_line']}")
    write_json(args.json, {"machine": machine(), "command": command[1:], "results": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
