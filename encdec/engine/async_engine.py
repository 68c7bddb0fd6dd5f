"""AsyncLLMEngine: many asyncio callers, one engine loop, a stream of outputs per request.

The `LLMEngine` is not thread-safe, so one background thread owns it: it takes new requests
and aborts from an inbox between steps, runs `step()` while there is work, and hands each
output to its request's asyncio queue on the caller's event loop (`call_soon_threadsafe`).
The model's long tensor operations release the GIL, so the event loop stays responsive while
the engine runs.

* `generate()` adds the request (preprocessing, validation and tokenization happen on the
  engine thread; a bad request raises its ValueError to its own caller only) and yields its
  outputs; leaving the `async for` early, or cancelling the task, aborts the request and
  frees its blocks (that request only: not a later one that took its id, nor the one a
  refused duplicate id named). `abort(request_id)` from anywhere else also ends the
  caller's stream, as vLLM's does: with a last output whose unfinished completions say
  finish_reason "abort".
* `max_waiting_requests` bounds the requests that wait for a place in the running batch (those
  not yet running that do not fit its free places, `num_queued`); past it `generate()` raises
  `EngineOverloaded` at once. A place is a sequence (`max_num_seqs`; n > 1 samples and beams
  take several) and a request (`max_running_requests`), filled in arrival order as the
  scheduler fills them. The engine thread counts them between steps, under the lock
  `generate()` checks under, so a burst that arrives while a step moves requests into the batch
  is counted against the batch as it was. A job of several requests (a list of prompts, a
  Whisper upload's windows) shares an `Admission`: it is taken or refused whole, refused if it
  would leave more than `max_waiting_requests` waiting while some already wait.
* A request whose own logits processor fails gets that error, alone (`LLMEngine.take_failures`);
  the others go on.
* If a step raises, every request in flight gets `EngineDeadError` (caused by the step's
  error), every request is aborted so all blocks are free, `is_healthy()` turns false and new
  requests are refused with the reason.
* The thread holds the engine only while it has work: an engine dropped without `shutdown()`
  is collected, and its thread ends.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Union

from encdec.engine.llm_engine import LLMEngine
from encdec.outputs import RequestOutput
from encdec.sampling.params import SamplingParams
from encdec.worker.cpu_memory import trim_heap

logger = logging.getLogger(__name__)
# Seconds the engine waits idle before it gives its steps' freed memory back to the system:
# long enough that a client sending its next request gets warm pages.
IDLE_TRIM_SECONDS = 1.0


class EngineOverloaded(RuntimeError):
    """Too many requests are waiting; try again later (HTTP 429)."""


class EngineDeadError(RuntimeError):
    """The engine loop failed; the engine takes no more requests."""


@dataclass
class Admission:
    """A job of several requests, taken or refused whole: the first of them to reach
    `generate()` is checked against `max_waiting_requests` for all `size` of them, the rest
    follow it in. `taken` is set once `size` of them are in the engine, validated (the server
    then starts its stream)."""

    size: int = 1
    admitted: bool = False
    added: int = 0
    taken: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self) -> None:
        self.added += 1
        if self.added >= self.size:
            self.taken.set()


@dataclass
class RequestStream:
    """Where a request's outputs go: a queue on its caller's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    added: asyncio.Future  # resolved once the engine took (or refused) the request

    def put(self, item: Any) -> bool:
        """Queue `item` for the caller; False if its event loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop was closed
            return False
        return True

    def resolve(self, error: Optional[BaseException]) -> None:
        def settle() -> None:
            if not self.added.done():
                if error is None:
                    self.added.set_result(None)
                else:
                    self.added.set_exception(error)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop was closed
            pass


@dataclass(frozen=True)
class Room:
    """The running batch's free places as waiting requests fill them in arrival order: free
    sequences, free requests (None: no limit) and the requests left waiting without a place
    (once one waits, the ones after it wait too, as the scheduler admits them in order)."""

    seqs: int
    requests: Optional[int]
    queued: int = 0

    def wait(self, places: int) -> "Room":
        """The room after one more waiting request of `places` sequences."""
        if not self.queued and places <= self.seqs and self.requests != 0:
            return Room(self.seqs - places, None if self.requests is None else self.requests - 1)
        return Room(self.seqs, self.requests, self.queued + 1)


def _places(params: Any) -> int:
    """The sequences a request of `params` may run at once (one for what is no SamplingParams:
    the engine refuses it)."""
    return params.max_num_seqs if isinstance(params, SamplingParams) else 1


class AsyncLLMEngine:
    """An `LLMEngine` served to asyncio callers; see the module docstring."""

    def __init__(self, engine: LLMEngine, max_waiting_requests: Optional[int] = None):
        if max_waiting_requests is not None and max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {max_waiting_requests}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        # ("add", id, prompt, params, stream, cross_kv, arrival_time) | ("abort", id, the stream it is for or None)
        self._inbox: deque = deque()
        self._streams: dict[str, RequestStream] = {}  # owned by the engine thread
        self._wakeup = threading.Event()
        self._ids = itertools.count()
        self._dead: Optional[BaseException] = None
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        # see _count_free_places: the batch's free places, and the waiting (id, places) to fill them
        self._free = Room(0, 0)
        self._waiting: list[tuple[str, int]] = []
        self._count_free_places()

    @classmethod
    def from_model(cls, model: str, max_waiting_requests: Optional[int] = None,
                   **engine_options: Any) -> "AsyncLLMEngine":
        """Load `model` with `LLM`'s options (`LLMEngine.from_model`)."""
        return cls(LLMEngine.from_model(model, **engine_options), max_waiting_requests)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def get_tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's call, awaited as there)."""
        return self.engine.tokenizer

    @property
    def model_config(self) -> Any:
        return self.engine.model_config

    @property
    def scheduler_config(self) -> Any:
        return self.engine.scheduler_config

    def check_can_ever_fit(self, encoder_len: int, decoder_len: int, num_seqs: int, field: str) -> None:
        """`LLMEngine.check_can_ever_fit` (read-only: safe beside the engine's thread)."""
        self.engine.check_can_ever_fit(encoder_len, decoder_len, num_seqs, field)

    def is_healthy(self) -> bool:
        """False once the engine failed or shutdown began: it takes no more requests."""
        return self._dead is None and not self._stopping

    @property
    def dead_error(self) -> Optional[BaseException]:
        return self._dead

    def num_waiting(self) -> int:
        """Requests taken but not yet running (the inbox and the scheduler's waiting queue)."""
        return sum(1 for item in list(self._inbox) if item[0] == "add") + len(self.engine.scheduler.waiting)

    def num_queued(self) -> int:
        """The waiting requests that the running batch has no place for (see the module
        docstring). `max_waiting_requests` bounds them."""
        return self._room().queued

    def _room(self) -> Room:
        """The free places as of the last count between steps, filled by the requests waiting
        then and those taken since, less those whose abort is on its way."""
        inbox = list(self._inbox)
        leaving = {item[1] for item in inbox if item[0] == "abort"}
        waiting = self._waiting + [(item[1], _places(item[3])) for item in inbox if item[0] == "add"]
        room = self._free
        for request_id, need in waiting:
            if request_id not in leaving:
                room = room.wait(need)
        return room

    def _count_free_places(self) -> None:
        """On the engine thread, between steps: the batch's free places, `max_num_seqs` less the
        sequences the running and swapped groups may run, and `max_running_requests` less those
        groups (none while the cache is out of blocks); and the requests waiting for them."""
        scheduler, config = self.engine.scheduler, self.engine.scheduler_config
        held = [*scheduler.running, *scheduler.swapped]
        seqs = config.max_num_seqs - sum(group.get_max_num_running_seqs() for group in held)
        requests = None if config.max_running_requests is None else config.max_running_requests - len(held)
        if scheduler.out_of_blocks and held:
            seqs = requests = 0
        free = Room(max(0, seqs), requests if requests is None else max(0, requests))
        waiting = [(group.request_id, group.get_max_num_running_seqs()) for group in scheduler.waiting]
        with self._lock:
            self._free, self._waiting = free, waiting

    async def transcribe(self, inputs: Any, **options: Any) -> list:
        """Whisper: `LLM.transcribe`'s call and result, its windows in this engine's batch
        (`encdec.whisper.transcribe.transcribe_async`), taken or refused whole."""
        from encdec.whisper.transcribe import transcribe_async

        return await transcribe_async(self, inputs, **options)

    # -- requests ------------------------------------------------------------------------
    async def generate(self, prompt: Any, sampling_params: SamplingParams,
                       request_id: Optional[str] = None,
                       return_cross_kv: Union[bool, Callable[[RequestOutput], bool]] = False,
                       admission: Optional["Admission"] = None,
                       arrival_time: Optional[float] = None) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs until the last one (`finished` set);
        `return_cross_kv` and `arrival_time` as for `LLMEngine.add_request`; `admission`: the
        job it is part of."""
        request_id = request_id if request_id is not None else f"async-{next(self._ids)}"
        if isinstance(sampling_params, SamplingParams):  # never to run: refused, not queued (429)
            self.engine.check_num_seqs(sampling_params)
        loop = asyncio.get_running_loop()
        stream = RequestStream(loop, asyncio.Queue(), loop.create_future())
        with self._lock:
            first = admission is None or not admission.admitted  # the rest of a job follow it in
            self._check_accepting(job=(1 if admission is None else admission.size) if first else 0,
                                  places=_places(sampling_params))
            if admission is not None:
                admission.admitted = True
            self._inbox.append(("add", request_id, prompt, sampling_params, stream, return_cross_kv, arrival_time))
        self._ensure_running()
        finished = refused = False
        try:
            try:
                await stream.added
            except ValueError:
                refused = True
                raise
            if admission is not None:
                admission.add()
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not (finished or refused):
                self._abort(request_id, stream)

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Stop a request, or each of a list of them (vLLM's signature), wherever it is (done by
        the engine thread before its next step); its caller gets a last output (finish_reason
        "abort" where a completion had not finished)."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        ids = list(ids) if isinstance(ids, Iterable) else [ids]
        if not all(isinstance(one, str) for one in ids):
            raise ValueError(f"request_id must be a string or an iterable of them, got {request_id!r}")
        for one in ids:
            self._abort(one, None)

    def _abort(self, request_id: str, stream: Optional[RequestStream]) -> None:
        self._inbox.append(("abort", request_id, stream))
        self._wakeup.set()

    def _check_accepting(self, job: int = 1, places: int = 1) -> None:
        """Refuse new work once dead or stopping, and a job of `job` requests (of `places`
        sequences each) that would leave more than `max_waiting_requests` waiting while some
        already wait (on an engine with none waiting, any job may start)."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped after an error and takes no more requests: "
                                  f"{type(self._dead).__name__}: {self._dead}") from self._dead
        if self._stopping:
            stopped = self._thread is None or not self._thread.is_alive()
            raise EngineDeadError(f"the engine {'is shut down' if stopped else 'is shutting down'}")
        if job and self.max_waiting_requests is not None:
            room = after = self._room()
            for _ in range(job):
                after = after.wait(places)
            if room.queued and after.queued > self.max_waiting_requests:
                queued = room.queued
                waiting = "1 request is" if queued == 1 else f"{queued} requests are"
                raise EngineOverloaded(f"{waiting} waiting for a place in the batch "
                                       f"(max_waiting_requests={self.max_waiting_requests}); try again later")

    # -- the engine loop -------------------------------------------------------------------
    def _ensure_running(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=_engine_thread, args=(weakref.ref(self), self._wakeup),
                                            name="encdec-engine", daemon=True)
            self._thread.start()
            # dropped without shutdown(): the thread ends (at exit, daemon threads just stop)
            weakref.finalize(self, self._wakeup.set).atexit = False
        self._wakeup.set()

    def _serve_until_idle(self) -> Optional[bool]:
        """Take in requests and aborts and step until none is left: whether it stepped; None
        once the engine stopped (shut down, or failed: then in an unknown state, it serves no
        more)."""
        stepped = False
        try:
            while not self._stopping:
                self._drain_inbox()
                self._count_free_places()  # aborts free places
                if not self.engine.has_unfinished_requests():
                    return stepped
                stepped = True
                self._step()
        except BaseException as err:
            self._fail_all(err)
            return None
        self._fail_all(EngineDeadError("the engine shut down"), dead=False)
        return None

    def _step(self) -> None:
        """One engine step; each output to its request's caller."""
        engine = self.engine
        outputs = engine.step()
        self._count_free_places()  # before the outputs: a caller told it finished may add more
        for request_id, error in engine.take_failures().items():  # theirs alone
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(error)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            delivered = stream.put(out)
            if out.finished or not delivered:
                del self._streams[out.request_id]
                if not out.finished:  # its caller is gone
                    engine.abort_request(out.request_id)

    def _drain_inbox(self) -> None:
        while self._inbox:
            with self._lock:  # a request leaves the inbox for the waiting ones it is counted with
                item = self._inbox.popleft()
                if item[0] == "add":
                    self._waiting.append((item[1], _places(item[3])))
            if item[0] == "abort":
                _, request_id, owner = item
                stream = self._streams.get(request_id)
                if stream is None or (owner is not None and owner is not stream):
                    continue  # over, or another caller's request now
                last = self.engine.abort_request(request_id, final_output=owner is None)
                del self._streams[request_id]  # only now: were the abort to fail, its caller hears of it
                if last is not None:
                    stream.put(last)
                continue
            _, request_id, prompt, params, stream, return_cross_kv, arrival_time = item
            try:
                self.engine.add_request(request_id, prompt, params, arrival_time, return_cross_kv)
            except Exception as err:  # the caller's request is bad: refuse it alone
                with self._lock:  # and no longer count it as waiting (its caller may send the next at once)
                    self._waiting.remove((request_id, _places(params)))
                stream.resolve(err)
                continue
            except BaseException:  # the engine stops: back in the inbox, its caller hears of it with the rest
                self._inbox.appendleft(item)
                raise
            self._streams[request_id] = stream
            stream.resolve(None)

    def _fail_all(self, error: BaseException, dead: bool = True) -> None:
        """Abort every request in flight, give each the error (also if aborting fails), and
        stop taking work."""
        if dead:
            logger.exception("the engine failed and stops", exc_info=error)
            self._dead = error
            failure: BaseException = EngineDeadError(f"the engine failed: {type(error).__name__}: {error}")
            failure.__cause__ = error
        else:
            failure = error
        with self._lock:
            pending = [item for item in self._inbox if item[0] == "add"]
            self._inbox.clear()
        try:
            self.engine.abort_all()  # before the callers hear of it: their blocks are free then
        finally:
            for item in pending:
                item[4].resolve(failure)
            for stream in self._streams.values():
                stream.put(failure)
            self._streams.clear()

    async def shutdown(self) -> None:
        """Stop the loop: requests in flight end with EngineDeadError, their blocks freed."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)


def _engine_thread(ref: weakref.ref, wakeup: threading.Event) -> None:
    """The engine thread: serve the `AsyncLLMEngine` behind `ref` until it stops, holding it only
    while it has work, so that one dropped without `shutdown()` is collected (its finalizer wakes
    this thread, which then ends). Idle a while after steps, it gives their freed memory back."""
    stepped = False
    while True:
        async_engine = ref()
        if async_engine is None:
            return
        outcome = async_engine._serve_until_idle()
        del async_engine
        if outcome is None:
            return
        stepped = stepped or outcome
        if not wakeup.wait(IDLE_TRIM_SECONDS if stepped else None):
            try:  # idle a while: give back the pages the steps' activations left free
                trim_heap()
            except Exception:  # best effort: the engine serves on without it
                logger.exception("could not give the idle engine's free memory back")
            stepped = False
        wakeup.clear()
