import ctypes
import os
import platform
import subprocess
import sys

import pytest

from encdec.worker import cpu_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_keep_freed_memory_tunes_glibc_once_unless_disabled(monkeypatch):
    monkeypatch.setattr(cpu_memory, "_done", False)
    monkeypatch.setenv("ENCDEC_KEEP_FREED_MEMORY", "0")
    calls = []

    class Recorder:
        def __init__(self):
            self.libc = ctypes.CDLL("libc.so.6")

        def mallopt(self, option, value):
            calls.append((option, value))
            return self.libc.mallopt(option, value)

    monkeypatch.setattr(cpu_memory, "_libc", Recorder)
    assert cpu_memory.keep_freed_memory() is False and calls == []
    monkeypatch.delenv("ENCDEC_KEEP_FREED_MEMORY")
    assert cpu_memory.keep_freed_memory() is True
    assert dict(calls)[-3] == 1 << 30  # M_MMAP_THRESHOLD raised to 1 GiB
    assert cpu_memory.keep_freed_memory() is True and len(calls) == 3  # once per process


ARENA_PROBE = """
import ctypes, sys, threading
from encdec.worker.cpu_memory import use_one_arena
print(use_one_arena() if sys.argv[1] == "one" else None, flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
barrier = threading.Barrier(4)

def allocate():  # by default each new thread gets an arena of its own, up to glibc's cap
    barrier.wait()
    for _ in range(20000):
        libc.free(libc.malloc(4096))

threads = [threading.Thread(target=allocate) for _ in range(4)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
libc.malloc_stats()  # to stderr: an "Arena N:" paragraph per arena
"""


def arenas_after_threads(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode], capture_output=True, text=True,
                          env={**environ, **env}, check=True)
    return done.stdout.strip(), sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_use_one_arena_keeps_threads_in_one_arena_unless_the_environment_says_otherwise():
    assert arenas_after_threads("default") == ("None", 5)
    assert arenas_after_threads("one") == ("True", 1)
    assert arenas_after_threads("one", MALLOC_ARENA_MAX="2") == ("False", 2)


TRIM_PROBE = """
import ctypes
from encdec.worker.cpu_memory import keep_freed_memory, release_free_memory, trim_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

assert keep_freed_memory()
blocks = [libc.malloc(1 << 20) for _ in range(256)]
for block in blocks:
    libc.memset(block, 1, 1 << 20)
for block in blocks:
    libc.free(block)
kept = rss_mb()
release_free_memory()  # keeps the pages: the tuning wants them for the next steps
after_release = rss_mb()
trim_heap()  # gives them back whatever the tuning
print(kept, after_release, rss_mb())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim only")
def test_trim_heap_returns_what_keep_freed_memory_keeps():
    done = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True,
                          env={**os.environ, "ENCDEC_KEEP_FREED_MEMORY": "1"}, check=True)
    kept, after_release, after_trim = map(float, done.stdout.split())
    assert after_release > kept - 16, (kept, after_release)
    assert after_trim < kept - 200, (kept, after_trim)
