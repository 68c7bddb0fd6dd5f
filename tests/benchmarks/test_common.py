"""The benchmarks' process isolation: each engine's own peak memory, and a child that dies."""
import os
import signal
import time

import pytest

from benchmarks.common import peak_rss_mb, run_isolated


def idle(threads: int) -> dict:
    return {}


def killed(threads: int) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return {}


def test_a_child_reports_its_own_peak_rss_not_the_parent_s():
    """On Linux ru_maxrss carries the parent's memory over fork+exec into a spawned child."""
    held = bytearray(400 << 20)
    held[::4096] = b"\1" * len(range(0, len(held), 4096))  # touch every page
    parent = peak_rss_mb()
    assert parent > 400
    assert run_isolated(idle, 1)["peak_rss_mb"] < parent - 300


def test_a_child_that_dies_without_a_result_raises():
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("run_isolated hung"))
    signal.alarm(120)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"killed died without a result \(killed by SIGKILL\)"):
            run_isolated(killed, 1)
        assert time.monotonic() - start < 60
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
