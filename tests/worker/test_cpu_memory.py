import ctypes
import platform

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
