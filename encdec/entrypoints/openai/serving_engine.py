"""What the text endpoints share: ids, engine outputs added up, ValueErrors as 400s."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Optional, TypeVar, Union

from fastapi import Request
from pydantic import BaseModel

from encdec.entrypoints.openai.errors import value_error
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.protocol import UsageInfo
from encdec.inputs.long_texts import PIECE_CHARS
from encdec.outputs import CompletionOutput, PromptLogprobs, RequestOutput, SampleLogprobs


T = TypeVar("T")
# The text endpoints' own threads: tokenizing never waits behind the audio uploads that the
# loop's default pool decodes (an hour of audio takes seconds). Requests whose texts add up to
# more than PIECE_CHARS wait for a thread of their own: six 23 MB prompts (10 s each) held a
# short completion up 67 s when all shared the same two.
_TOKENIZING = ThreadPoolExecutor(max_workers=2, thread_name_prefix="encdec-tokenize")
_TOKENIZING_LONG = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encdec-tokenize-long")


async def off_loop(function: Callable[..., T], *args: Any, executor: Optional[Executor] = None) -> T:
    """`function(*args)` on `executor`'s threads (None: the loop's default ones), so that the
    event loop does not stall. Cancelled, it still waits for the thread to end before it
    raises: what the thread reads (an upload's file) and holds is in use until then."""
    job = asyncio.get_running_loop().run_in_executor(executor, function, *args)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        while not job.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([job])
        raise


async def tokenize_off_loop(tokenize: Callable[[], T], texts: Iterable[str]) -> T:
    """Run `tokenize` (of `texts`) off the event loop, on the text endpoints' threads."""
    pool = _TOKENIZING_LONG if sum(len(text) for text in texts) > PIECE_CHARS else _TOKENIZING
    return await off_loop(tokenize, executor=pool)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@contextlib.contextmanager
def bad_input(request_model: type[BaseModel], aliases: dict[str, str], default: Optional[str]) -> Iterator[None]:
    """ValueErrors of the engine or SamplingParams (bad input) become 400s whose `param` is the
    request field the message starts with (`aliases`: engine names to field names)."""
    try:
        yield
    except ValueError as err:
        names = {name: name for name in request_model.model_fields}
        raise value_error(err, {**names, **aliases}, default) from err


@dataclass
class Generated:
    """One completion added up from DELTA outputs."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        self.cumulative_logprob = delta.cumulative_logprob
        self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


class OutputCounter:
    """Counts a request's tokens into the metrics as its outputs arrive; observes the time to
    the first output of each engine request, and its times once it finishes."""

    def __init__(self, metrics: ServerMetrics, model: str, request: Request):
        self.metrics, self.model = metrics, model
        self.start = request.state.start_time
        self.lengths: dict[str, Counter[int]] = {}  # each engine request's sequences' tokens so far
        self.prompt_tokens = self.completion_tokens = 0

    def count(self, output: RequestOutput) -> None:
        if output.request_id not in self.lengths:
            self.lengths[output.request_id] = Counter()
            self.metrics.observe_first_token(self.model, output, self.start)
            self.prompt_tokens += self.metrics.count_prompt(self.model, output)
        self.completion_tokens += self.metrics.count_generated(self.model, output.outputs)
        lengths = self.lengths[output.request_id]
        for delta in output.outputs:
            lengths[delta.index] += len(delta.token_ids)
        if output.finished:
            self.metrics.observe_finished(self.model, output, max(lengths.values(), default=0))

    def usage(self) -> UsageInfo:
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                         total_tokens=self.prompt_tokens + self.completion_tokens)


async def collect(merged: AsyncIterator[tuple[int, RequestOutput]], counter: OutputCounter, num_prompts: int,
                  n: int = 1) -> tuple[list[list[Generated]], list[Optional[PromptLogprobs]]]:
    """The `n` completions of each of `num_prompts` prompts, added up from the merged DELTA
    outputs of their engine requests (each counted), and each prompt's prompt_logprobs (None
    unless asked for). A beam search whose beams ran out of tokens returns fewer than `n`."""
    generated = [[Generated() for _ in range(n)] for _ in range(num_prompts)]
    prompt_logprobs: list[Optional[PromptLogprobs]] = [None] * num_prompts
    async for i, out in merged:
        counter.count(out)
        if out.prompt_logprobs is not None:
            prompt_logprobs[i] = out.prompt_logprobs
        for delta in out.outputs:
            generated[i][delta.index].add(delta)
    return [[g for g in completions if g.finish_reason is not None] for completions in generated], prompt_logprobs
