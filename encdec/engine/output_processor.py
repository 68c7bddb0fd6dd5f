"""RequestOutputs from sequence groups, as each request's `output_kind` asks.

After every step the engine hands over each request that advanced. FINAL_ONLY requests get
one output, when they finish (their text is decoded once, at the end). CUMULATIVE and DELTA
requests get an output at every step, their text detokenized incrementally per sequence
(`encdec.engine.detokenizer`); a DELTA output holds, per completion, only the tokens, text and
log-probabilities that are new since the request's last output, and leaves out completions
with nothing new. Completions are indexed in the order their sequences joined the group.
Beam search gives its best `n` hypotheses once, when the search is over. As in vLLM, the stop
token that ends a completion (EOS or one of `stop_token_ids`) is in its token ids, not its text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from encdec.engine.detokenizer import IncrementalDetokenizer, decode
from encdec.outputs import CompletionOutput, RequestMetrics, RequestOutput
from encdec.sampling.params import RequestOutputKind, SamplingParams
from encdec.sequence import Sequence, SequenceGroup


@dataclass
class CompletionState:
    """What one completion of a streaming request has been given so far."""

    detokenizer: IncrementalDetokenizer
    num_tokens_sent: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_id: Optional[int]):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.states: dict[str, dict[int, CompletionState]] = {}  # request_id -> seq_id -> state

    def make_output(self, group: SequenceGroup) -> Optional[RequestOutput]:
        """The request's output for this step, or None when it has nothing to give now."""
        params = group.sampling_params
        finished = group.is_finished()
        kind = params.output_kind
        if finished:
            states = self.states.pop(group.request_id, {})
        elif kind is RequestOutputKind.FINAL_ONLY or group.beam_search is not None:
            return None
        else:
            states = self.states.setdefault(group.request_id, {})
        if group.beam_search is not None:
            outputs = self._beam_outputs(group)
        elif kind is RequestOutputKind.FINAL_ONLY:
            outputs = [self._final(index, seq, params) for index, seq in enumerate(group.get_seqs())]
        else:
            outputs = [self._streamed(index, seq, params, states)
                       for index, seq in enumerate(group.get_seqs())]
            outputs = [o for o in outputs if o is not None]
        first = next(iter(group.seqs.values()))
        return RequestOutput(group.request_id, first.prompt, list(first.data.prompt_token_ids),
                             group.encoder_seq.prompt, list(group.encoder_seq.data.prompt_token_ids),
                             outputs, finished,
                             metrics=RequestMetrics(group.arrival_time, group.first_token_time))

    def abort(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def _text(self, ids: list[int], finish_reason: Optional[str], params: SamplingParams) -> str:
        if self.tokenizer is None:
            return ""
        return decode(self.tokenizer, self._shown(ids, finish_reason, params), params.skip_special_tokens)

    def _shown(self, ids: list[int], finish_reason: Optional[str], params: SamplingParams) -> list[int]:
        """The ids a completion's text shows: all but the stop token that ended it."""
        if finish_reason == "stop" and ids and params.is_stop_token(ids[-1], self.eos_token_id):
            return ids[:-1]
        return ids

    def _final(self, index: int, seq: Sequence, params: SamplingParams) -> CompletionOutput:
        ids = seq.data.output_token_ids
        return CompletionOutput(index, self._text(ids, seq.status.finish_reason, params), list(ids),
                                seq.data.cumulative_logprob,
                                list(seq.output_logprobs) if params.logprobs is not None else None,
                                seq.status.finish_reason)

    def _streamed(self, index: int, seq: Sequence, params: SamplingParams,
                  states: dict[int, CompletionState]) -> Optional[CompletionOutput]:
        state = states.get(seq.seq_id)
        if state is None:
            state = states[seq.seq_id] = CompletionState(
                IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens))
        ids = seq.data.output_token_ids
        logprobs = seq.output_logprobs if params.logprobs is not None else None
        finished = seq.is_finished()
        shown = self._shown(ids, seq.status.finish_reason, params) if finished else ids
        piece = state.detokenizer.step(shown, finished) if self.tokenizer is not None else ""
        sent, state.num_tokens_sent = state.num_tokens_sent, len(ids)
        if params.output_kind is RequestOutputKind.CUMULATIVE:
            return CompletionOutput(index, state.detokenizer.text, list(ids), seq.data.cumulative_logprob,
                                    list(logprobs) if logprobs is not None else None,
                                    seq.status.finish_reason)
        if sent == len(ids) and not piece:
            return None
        return CompletionOutput(index, piece, ids[sent:], seq.data.cumulative_logprob,
                                logprobs[sent:] if logprobs is not None else None,
                                seq.status.finish_reason)

    def _beam_outputs(self, group: SequenceGroup) -> list[CompletionOutput]:
        """The best `n` hypotheses of a finished search (its beams, if it was cut short)."""
        params = group.sampling_params
        search = group.beam_search
        if search.finished:
            return [CompletionOutput(index, self._text(h.token_ids, h.finish_reason, params),
                                     list(h.token_ids), h.cumulative_logprob, None, h.finish_reason)
                    for index, h in enumerate(search.best(params.n))]
        return [self._final(index, seq, params) for index, seq in enumerate(group.get_seqs())]
