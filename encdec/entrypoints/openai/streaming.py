"""Async plumbing shared by the endpoints: merged engine streams, SSE, client disconnects.

A client that goes away cancels the work it asked for: the engine requests behind a
cancelled `AsyncLLMEngine.generate` are aborted and their blocks freed.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Awaitable, Optional, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from encdec.engine.async_engine import Admission, EngineDeadError
from encdec.entrypoints.openai.errors import ClientDisconnected, OpenAIError

logger = logging.getLogger("encdec.server")
T = TypeVar("T")
DONE = "data: [DONE]\n\n"


def sse(data: BaseModel | dict) -> str:
    """One server-sent event: `data: {json}` and a blank line; a model's null fields left out."""
    text = (data.model_dump_json(exclude_none=True) if isinstance(data, BaseModel)
            else json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return f"data: {text}\n\n"


async def merge_async_iterators(*iterators: AsyncIterator[T]) -> AsyncIterator[tuple[int, T]]:
    """`(index, item)` from several async iterators as items come; an error in one, or
    closing the merge, cancels the others."""
    pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                # A stream's end is read, not raised: raised here, its traceback would hold
                # this frame, which holds the task, which holds it (a cycle keeping every
                # stream and its last output until a full garbage collection).
                if isinstance(task.exception(), StopAsyncIteration):
                    continue
                item = task.result()  # a stream's error is raised here
                pending[asyncio.ensure_future(anext(iterators[index]))] = index
                yield index, item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`await work`, cancelled (and ClientDisconnected raised) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


def stream_error(err: BaseException, request_id: str) -> OpenAIError:
    """What an error inside a stream that has already started tells the client (an error
    event, which the client raises as APIError)."""
    if isinstance(err, OpenAIError):
        return err
    if isinstance(err, ValueError):
        return OpenAIError(400, str(err))
    if isinstance(err, EngineDeadError):  # as the plain response's (`add_error_handlers`)
        logger.error("request %s: %s", request_id, err)
        return OpenAIError(500, str(err), code="engine_dead")
    logger.exception("request %s: stream failed", request_id, exc_info=err)
    return OpenAIError(500, f"{type(err).__name__}: {err}")


async def event_stream(request: Request, events: AsyncIterator[str],
                       admission: Optional[Admission] = None) -> StreamingResponse:
    """An SSE response of `events`. It starts at the first event, or once the job's requests are
    all taken (`admission`), whichever comes first: errors before then (bad input, a full queue)
    are plain HTTP errors, later ones an error event. So a beam search, whose first event is
    its result, does not hold back the status line."""
    first = asyncio.ensure_future(anext(events))
    started = {first} if admission is None else {first, asyncio.ensure_future(admission.taken.wait())}
    try:
        await cancel_on_disconnect(request, asyncio.wait(started, return_when=asyncio.FIRST_COMPLETED))
    except BaseException:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        raise
    finally:
        for waiter in started - {first}:
            waiter.cancel()
    if first.done():
        first.result()  # raises an error before the stream started
    request_id = request.state.request_id

    async def body() -> AsyncIterator[str]:
        try:
            yield await first
            async for event in events:
                yield event
        except Exception as err:  # the status line is sent: report it in the stream, then end it
            error = stream_error(err, request_id)
            request.state.stream_status = error.status  # what the middleware counts and logs
            yield sse(error.body())  # as vLLM does, with [DONE]
            yield DONE
        finally:
            if not first.done():
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
            await events.aclose()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
