"""merge_async_iterators: every item of every stream, and a finished merge freed at once."""
from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from encdec.entrypoints.openai.streaming import merge_async_iterators


async def count(n: int, fail_at: int | None = None):
    for i in range(n):
        await asyncio.sleep(0)
        if i == fail_at:
            raise ValueError(f"stream failed at {i}")
        yield i


def test_merge_yields_every_item_with_its_index():
    async def run():
        return [pair async for pair in merge_async_iterators(count(2), count(0), count(3))]
    pairs = asyncio.run(run())
    assert sorted(pairs) == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]
    assert [i for index, i in pairs if index == 2] == [0, 1, 2]  # each stream in its order


def test_an_error_in_one_stream_cancels_the_others():
    endless_closed = asyncio.Event()

    async def endless():
        try:
            while True:
                await asyncio.sleep(0)
                yield 0
        finally:
            endless_closed.set()

    async def run():
        forever = endless()
        with pytest.raises(ValueError, match="failed at 2"):
            async for _ in merge_async_iterators(count(5, fail_at=2), forever):
                pass
        await forever.aclose()
        return endless_closed.is_set()
    assert asyncio.run(run())


def test_a_finished_merge_is_freed_without_the_garbage_collector():
    """A stream's end must not tie the merge's frame, and the streams it holds, in a reference
    cycle (its StopAsyncIteration's traceback holding the frame that holds its task): each
    finished request's outputs would then wait for a full collection."""
    async def run():
        streams = [count(2), count(3)]
        alive = [weakref.ref(s) for s in streams]
        items = [pair async for pair in merge_async_iterators(*streams)]
        del streams
        return items, alive
    gc.collect()
    gc.disable()
    try:
        items, alive = asyncio.run(run())
        assert len(items) == 5
        assert [ref() for ref in alive] == [None, None]
    finally:
        gc.enable()
