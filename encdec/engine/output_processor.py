"""RequestOutputs from sequence groups, as each request's `output_kind` asks.

After every step the engine hands over each request that advanced. FINAL_ONLY requests get
one output, when they finish (their text is decoded once, at the end). CUMULATIVE and DELTA
requests get an output at every step, their text detokenized incrementally per sequence
(`encdec.engine.detokenizer`); a DELTA output holds, per completion, only the tokens, text and
log-probabilities that are new since the request's last output, and leaves out completions
with nothing new. Completions are indexed in the order their sequences joined the group.
Beam search gives its best `n` hypotheses once, when the search is over. As in vLLM, the stop
token that ends a completion (EOS or one of `stop_token_ids`) is in its token ids, not its text
(unless `include_stop_str_in_output`), and `stop_reason` names it (None for EOS).

A request with `detokenize=False` gets empty texts: nothing is decoded. Otherwise each entry of
its `prompt_logprobs` and `logprobs` gets its token's text alone, special tokens included (vLLM's
`decoded_token`).

Stop strings (`encdec.engine.stop_strings`) are looked for here, in each completion's text as
it is detokenized after every step (also for FINAL_ONLY requests that have some): a completion
that meets one is finished here and its blocks freed (`free_seq`), as vLLM's output processor
aborts it. In a beam search a candidate whose token completes a stop string is a finished
hypothesis (`ends_in_stop_string`, as Hugging Face's stop strings end one), and the hypotheses
given are cut at their first stop string (text and token ids, as a stream stops).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from encdec.engine.detokenizer import IncrementalDetokenizer, decode
from encdec.engine.stop_strings import StopStrings
from encdec.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from encdec.sampling.params import RequestOutputKind, SamplingParams
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus


@dataclass
class CompletionState:
    """One completion's text so far, its stop strings, and what a streaming request has been
    given of it."""

    detokenizer: Optional[IncrementalDetokenizer]  # None when nothing is decoded
    stops: Optional[StopStrings]
    text: str = ""  # what the completion shows so far
    done: bool = False  # its text is final (finished, and read since)
    num_tokens_sent: int = 0
    num_chars_sent: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_id: Optional[int], free_seq: Callable[[Sequence], None]):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.free_seq = free_seq
        self.states: dict[str, dict[int, CompletionState]] = {}  # request_id -> seq_id -> state

    def make_output(self, group: SequenceGroup) -> Optional[RequestOutput]:
        """The request's output for this step, or None when it has nothing to give now."""
        params = group.sampling_params
        kind = params.output_kind
        incremental = group.beam_search is None and (kind is not RequestOutputKind.FINAL_ONLY or params.stop)
        if incremental:
            states = self.states.setdefault(group.request_id, {})
            for seq in group.get_seqs():
                self._read(seq, params, states)
        finished = group.is_finished()
        if finished:
            states = self.states.pop(group.request_id, {})
            if group.metrics.finished_time is None:
                group.metrics.finished_time = time.monotonic()
        elif kind is RequestOutputKind.FINAL_ONLY or group.beam_search is not None:
            return None
        if group.beam_search is not None:
            outputs = self._beam_outputs(group)
        elif kind is RequestOutputKind.FINAL_ONLY and not params.stop:
            outputs = [self._final(index, seq, params) for index, seq in enumerate(group.get_seqs())]
        else:
            outputs = [self._streamed(index, seq, params, states[seq.seq_id])
                       for index, seq in enumerate(group.get_seqs())]
            outputs = [o for o in outputs if o is not None]
        first = next(iter(group.seqs.values()))
        prompt_logprobs = group.prompt_logprobs
        if kind is RequestOutputKind.DELTA:
            group.prompt_logprobs = None  # given once
        return RequestOutput(group.request_id, first.prompt, list(first.data.prompt_token_ids),
                             group.encoder_seq.prompt, list(group.encoder_seq.data.prompt_token_ids),
                             outputs, finished,
                             metrics=dataclasses.replace(group.metrics),
                             prompt_logprobs=prompt_logprobs)

    def abort(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def name_tokens(self, logprobs: PromptLogprobs, params: SamplingParams) -> PromptLogprobs:
        """Set each entry's `decoded_token` (in place), unless nothing is to be decoded."""
        if self.tokenizer is not None and params.detokenize:
            for entry in filter(None, logprobs):
                for token, logprob in entry.items():
                    logprob.decoded_token = decode(self.tokenizer, [token], skip_special_tokens=False)
        return logprobs

    def ends_in_stop_string(self, ids: list[int], token: int, params: SamplingParams) -> bool:
        """Whether `token` after the output `ids` completes one of the request's stop strings
        (past its first `min_tokens`): a beam search candidate that does is a finished
        hypothesis, as Hugging Face's stop strings end one. Only the last tokens are decoded,
        enough for the longest stop string's characters before the new token's."""
        if (not params.stop or self.tokenizer is None or not params.detokenize
                or len(ids) < (params.min_tokens or 0)):
            return False
        longest = max(map(len, params.stop))
        num_tokens = longest
        while True:
            tail = ids[-num_tokens:]
            before = decode(self.tokenizer, tail, params.skip_special_tokens)
            after = decode(self.tokenizer, tail + [token], params.skip_special_tokens)
            new = len(os.path.commonprefix([before, after]))  # where the token's text begins
            # a tail may begin inside a character (bytes shown as U+FFFD): those do not count
            if new - (len(before) - len(before.lstrip("\ufffd"))) >= longest - 1 or num_tokens >= len(ids):
                break
            num_tokens *= 2
        return any(after.find(stop, max(new - len(stop) + 1, 0)) >= 0 for stop in params.stop)

    def _text(self, ids: list[int], finish_reason: Optional[str], params: SamplingParams) -> str:
        if self.tokenizer is None or not params.detokenize:
            return ""
        return decode(self.tokenizer, self._shown(ids, finish_reason, params), params.skip_special_tokens)

    def _shown(self, ids: list[int], finish_reason: Optional[str], params: SamplingParams) -> list[int]:
        """The ids a completion's text shows: all but the stop token that ended it, unless
        `include_stop_str_in_output` (as in vLLM)."""
        if (finish_reason == "stop" and ids and not params.include_stop_str_in_output
                and params.is_stop_token(ids[-1], self.eos_token_id)):
            return ids[:-1]
        return ids

    def _final(self, index: int, seq: Sequence, params: SamplingParams) -> CompletionOutput:
        ids = seq.data.output_token_ids
        reason = seq.status.finish_reason
        return CompletionOutput(index, self._text(ids, reason, params), list(ids), seq.data.cumulative_logprob,
                                list(seq.output_logprobs) if params.logprobs is not None else None,
                                reason, stop_token(ids, reason, params))

    def _read(self, seq: Sequence, params: SamplingParams, states: dict[int, CompletionState]) -> None:
        """Detokenize the completion's new tokens; finish it at a stop string."""
        state = states.get(seq.seq_id)
        decodes = self.tokenizer is not None and params.detokenize
        if state is None:
            state = states[seq.seq_id] = CompletionState(
                IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens) if decodes else None,
                StopStrings(params) if params.stop else None)
        if not decodes or state.done:
            return
        ids = seq.data.output_token_ids
        finished = seq.is_finished()
        shown = self._shown(ids, seq.status.finish_reason, params) if finished else ids
        state.detokenizer.step(shown, finished)
        text = state.detokenizer.text
        if state.stops is not None and state.stops.update(text, len(ids)) is not None:
            if not finished:
                self.free_seq(seq)
            seq.finish(SequenceStatus.FINISHED_STOPPED)  # also one that reached max_tokens at it
        state.done = seq.is_finished()
        state.text = text if state.stops is None else state.stops.visible(text, state.done)

    def _streamed(self, index: int, seq: Sequence, params: SamplingParams,
                  state: CompletionState) -> Optional[CompletionOutput]:
        ids = seq.data.output_token_ids
        logprobs = seq.output_logprobs if params.logprobs is not None else None
        reason = seq.status.finish_reason
        stop_reason = (state.stops.hit if state.stops is not None and state.stops.hit is not None
                       else stop_token(ids, reason, params))
        if params.output_kind is not RequestOutputKind.DELTA:  # CUMULATIVE, or FINAL_ONLY with stop strings
            return CompletionOutput(index, state.text, list(ids), seq.data.cumulative_logprob,
                                    list(logprobs) if logprobs is not None else None, reason, stop_reason)
        piece = state.text[state.num_chars_sent:]
        sent = state.num_tokens_sent
        state.num_tokens_sent, state.num_chars_sent = len(ids), len(state.text)
        if sent == len(ids) and not piece and seq.status is not SequenceStatus.FINISHED_ABORTED:
            return None  # nothing new (an abort is news: its output is the last)
        return CompletionOutput(index, piece, ids[sent:], seq.data.cumulative_logprob,
                                logprobs[sent:] if logprobs is not None else None, reason, stop_reason)

    def _beam_outputs(self, group: SequenceGroup) -> list[CompletionOutput]:
        """The best `n` hypotheses of a finished search (ranked with its running beams if it was
        cut short), each cut at its first stop string (its text, and its tokens after the one
        that completed it)."""
        params = group.sampling_params
        search = group.beam_search
        hypotheses = search.best(params.n) if search.done else search.cut_short(
            [(seq.data.output_token_ids, seq.data.cumulative_logprob) for seq in group.get_seqs()], params.n)
        outputs = []
        for index, h in enumerate(hypotheses):
            ids, reason = list(h.token_ids), h.finish_reason
            cut = self._first_stop(ids, reason, params) if params.stop else None
            if cut is None:
                text, stop_reason = self._text(ids, reason, params), stop_token(ids, reason, params)
            else:
                (ids, text, stop_reason), reason = cut, "stop"
            outputs.append(CompletionOutput(index, text, ids, h.cumulative_logprob, None, reason, stop_reason))
        return outputs

    def _first_stop(self, ids: list[int], reason: Optional[str],
                    params: SamplingParams) -> Optional[tuple[list[int], str, str]]:
        """Where a stop string ends a finished hypothesis, read token by token as a stream is:
        its ids up to the token that completed it, its text and the stop string; None if none does."""
        if self.tokenizer is None or not params.detokenize:
            return None
        detokenizer, stops = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens), StopStrings(params)
        for n in range(1, len(ids) + 1):
            last = n == len(ids)
            detokenizer.step(self._shown(ids, reason, params) if last else ids[:n], last)
            if stops.update(detokenizer.text, n) is not None:
                return ids[:n], stops.visible(detokenizer.text, True), stops.hit
        return None


def stop_token(ids: list[int], finish_reason: Optional[str], params: SamplingParams) -> Optional[int]:
    """vLLM's `stop_reason` for a completion its last token stopped: one of `stop_token_ids`
    (None for EOS, or when something else ended it)."""
    if finish_reason == "stop" and ids and ids[-1] in params.stop_token_ids:
        return ids[-1]
    return None
