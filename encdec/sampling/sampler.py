"""From last-token logits to the next token of every scheduled sequence.

Beam rows first become log-probabilities, as Hugging Face's beam search processes them; then
the logits processors run over the whole batch (`logits_processors.py`). Greedy rows take the
argmax, sampled rows draw with temperature / top-k / top-p / min-p, both with log-probabilities
of the processed logits. Each sample of a seeded request draws from its own generator (the
i-th of n from seed + i, as vLLM's), so it depends neither on the rest of the batch nor on its
siblings (one that stops early changes no other). A group in its first step with n > 1 draws n samples from its one
prompt row (the engine forks them); a group prefilled again after preemption by recompute
draws one per row. A beam group returns its ranked candidates
(`beam_search.top_candidates`), each with its running score, for the engine's `BeamSearch`.
A group whose processed logits leave no token to choose fails alone (`unusable_rows`), where
Hugging Face's greedy search would take token 0 and its sampling would raise for the batch.
All SamplingParams here are resolved (`encdec.generation_config.resolve_sampling_params`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from encdec.outputs import Logprob, PromptLogprobs, logprob_entry
from encdec.sampling.beam_search import num_candidates, top_candidates
from encdec.sampling.logits_processors import apply_logits_processors
from encdec.sampling.params import SamplingParams
from encdec.sequence import SequenceGroupMetadata


@dataclass
class SequenceOutput:
    parent_seq_id: int
    token_id: int
    logprob: float
    top_logprobs: Optional[dict[int, Logprob]] = None
    beam_score: Optional[float] = None  # beam search: the parent's running score + logprob


@dataclass
class GroupOutput:
    request_id: str
    samples: list[SequenceOutput]
    error: Optional[Exception] = None  # one of its logits processors failed: no samples
    prompt_logprobs: Optional[PromptLogprobs] = None  # its first prefill's, when asked for


SamplerOutput = list[GroupOutput]


@dataclass
class SamplingMetadata:
    """Per group: its params, rows in the logits, their seq ids and token histories."""

    groups: list[SequenceGroupMetadata]
    row_slices: list[slice] = field(default_factory=list)

    @classmethod
    def from_groups(cls, groups: list[SequenceGroupMetadata]) -> "SamplingMetadata":
        slices, start = [], 0
        for g in groups:
            slices.append(slice(start, start + len(g.seq_data)))
            start += len(g.seq_data)
        return cls(groups, slices)


class Sampler:
    def __init__(self, eos_token_id: Optional[int], vocab_size: int):
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        scores = logits[:, :self.vocab_size]
        beam = [bool(g.sampling_params.use_beam_search) for g in meta.groups]
        # Hugging Face's beam search processes log-probabilities (and with renormalize_logits
        # normalizes them again); openai-whisper's takes the log-probabilities of the processed logits.
        whisper = [is_beam and g.sampling_params.beam_rules == "whisper"
                   for g, is_beam in zip(meta.groups, beam)]
        hf = [is_beam and not w for is_beam, w in zip(beam, whisper)]
        renormalized = [w or (h and bool(g.sampling_params.renormalize_logits))
                        for g, w, h in zip(meta.groups, whisper, hf)]
        for rows in _runs(hf, meta.row_slices):
            scores[rows] = torch.log_softmax(scores[rows], dim=-1)
        failed = apply_logits_processors(scores, [(data, g.sampling_params) for g in meta.groups
                                                  for data in g.seq_data.values()], self.eos_token_id)
        for row, error in unusable_rows(scores, meta, beam).items():
            failed.setdefault(row, error)
        for rows in _runs(renormalized, meta.row_slices):
            scores[rows] = torch.log_softmax(scores[rows], dim=-1)
        # log-probability = score - log_normalizer; beam rows already hold log-probabilities.
        log_normalizer = torch.zeros(scores.shape[0], dtype=scores.dtype, device=scores.device)
        for rows in _runs([not is_beam for is_beam in beam], meta.row_slices):
            log_normalizer[rows] = logsumexp_rows(scores[rows])
        greedy = scores.argmax(dim=-1, keepdim=True) if any(
            not is_beam and g.sampling_params.is_greedy for g, is_beam in zip(meta.groups, beam)) else None
        errors = [failed and next((failed[i] for i in range(rows.start, rows.stop) if i in failed), None)
                  for rows in meta.row_slices]
        beam_outputs = self._beam_outputs(scores, meta, [is_beam and not error
                                                         for is_beam, error in zip(beam, errors)])
        outputs = []
        for index, (g, rows, is_beam, error) in enumerate(zip(meta.groups, meta.row_slices, beam, errors)):
            params = g.sampling_params
            if error:
                outputs.append(GroupOutput(g.request_id, [], error))
                continue
            if is_beam:
                outputs.append(beam_outputs[index])
                continue
            if params.is_greedy:
                tokens = greedy[rows]
            else:
                tokens = _sample(scores[rows], params, _sample_generators(g))
            outputs.append(_group_output(g, tokens, scores[rows], log_normalizer[rows], params))
        return outputs

    def _beam_outputs(self, scores: torch.Tensor, meta: SamplingMetadata,
                      picked: list[bool]) -> dict[int, GroupOutput]:
        """The ranked candidates of the picked (beam) groups, by group index; groups with as
        many beams and candidates are ranked together."""
        shapes: dict[tuple[int, int], list[int]] = {}
        for index, (g, rows) in enumerate(zip(meta.groups, meta.row_slices)):
            if picked[index]:
                params = g.sampling_params
                with_eos = self.eos_token_id is not None and not params.ignore_eos
                count = num_candidates(params, len(params.stop_token_ids) + with_eos)
                shapes.setdefault((rows.stop - rows.start, count), []).append(index)
        outputs = {}
        for (_, count), indices in shapes.items():
            groups = [meta.groups[i] for i in indices]
            ranked = top_candidates(_stacked(scores, [meta.row_slices[i] for i in indices]),
                                    [[d.cumulative_logprob for d in g.seq_data.values()] for g in groups],
                                    count)
            for index, g, (values, rows, tokens, logprobs) in zip(indices, groups, ranked):
                seq_ids = list(g.seq_data)
                outputs[index] = GroupOutput(g.request_id, [
                    SequenceOutput(seq_ids[row], token, logprob, beam_score=value)
                    for value, row, token, logprob in zip(values, rows, tokens, logprobs)])
        return outputs


def logsumexp_rows(scores: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dimension of 2-D `scores`, with the same bits for a row alone as
    in a batch. torch splits the sum of a single long row (a vocabulary's) between its threads,
    and sums each row of several in order on one thread: so a lone row is summed beside a copy
    of itself."""
    if len(scores) == 1:
        return torch.logsumexp(scores.expand(2, -1).contiguous(), dim=-1)[:1]
    return torch.logsumexp(scores, dim=-1)


def unusable_rows(scores: torch.Tensor, meta: SamplingMetadata, beam: list[bool]) -> dict[int, Exception]:
    """A row of each group that cannot go on, with its error: a row holding NaN or +inf (a
    RuntimeError: the model's numbers overflowed, or a logits processor wrote them), or a row
    where every token is -inf (a ValueError: the request's own rules ban every token). A beam
    group goes on while one of its beams has a token left, as in Hugging Face's beam search."""
    maxima = scores.amax(dim=-1).tolist()  # NaN where a row holds one
    failed: dict[int, Exception] = {}
    for g, rows, is_beam in zip(meta.groups, meta.row_slices, beam):
        step = len(next(iter(g.seq_data.values())).output_token_ids)
        nan = [i for i in range(rows.start, rows.stop) if not maxima[i] < math.inf]
        banned = [i for i in range(rows.start, rows.stop) if maxima[i] == -math.inf]
        if nan:
            failed[nan[0]] = RuntimeError(
                f"the logits for output token {step} hold NaN or inf, so no "
                f"token can be chosen (the model's numbers overflowed: a float16 or bfloat16 model "
                f"may need float32; or a logits processor wrote them)")
        elif banned and (not is_beam or len(banned) == rows.stop - rows.start):
            failed[banned[0]] = ValueError(
                f"every token is banned at output token {step} (by "
                f"suppress_tokens, bad_words_ids, min_tokens, the stop tokens, allowed_token_ids "
                f"without a forced token, or a logits processor), so no token can be chosen")
    return failed


def _stacked(scores: torch.Tensor, slices: list[slice]) -> torch.Tensor:
    """[len(slices), rows, vocab]: the rows of each slice (all as many), a view where the
    slices follow one another."""
    if all(a.stop == b.start for a, b in zip(slices, slices[1:])):
        return scores[slices[0].start:slices[-1].stop].unflatten(0, (len(slices), -1))
    return torch.stack([scores[rows] for rows in slices])


def _runs(flags: list[bool], row_slices: list[slice]) -> list[slice]:
    """The rows of the groups whose flag is set, neighbours joined: one slice where all are
    set. Slices are views, so a step's rows are neither gathered nor scattered."""
    runs: list[slice] = []
    for flag, rows in zip(flags, row_slices):
        if flag and runs and runs[-1].stop == rows.start:
            runs[-1] = slice(runs[-1].start, rows.stop)
        elif flag:
            runs.append(rows)
    return runs


def _num_samples(g: SequenceGroupMetadata) -> int:
    """`n` from the one row of a group's first step, one per row after it (a group prefilled
    again after preemption by recompute has its samples already)."""
    first_step = g.is_prompt and not any(d.output_token_ids for d in g.seq_data.values())
    return g.sampling_params.n if first_step else 1


def _sample_generators(g: SequenceGroupMetadata) -> list[torch.Generator]:
    """The generator of each sample the group draws this step: its n at the first step, from
    its one row, then each row's own."""
    if _num_samples(g) > 1:
        return g.generators
    return [g.generators[data.sample_index] for data in g.seq_data.values()]


def _sample(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator]) -> torch.Tensor:
    """[rows, samples a row] token ids drawn from the `sampling_logits`, sample i with
    `generators[i]` (rows draw their samples in turn)."""
    probs = sampling_logits(logits, params).softmax(dim=-1)
    num_samples = len(generators) // len(probs)
    probs = probs.repeat_interleave(num_samples, dim=0)
    if all(generator is generators[0] for generator in generators):
        noise = exponential_like(probs, generators[0])
    else:
        noise = torch.cat([exponential_like(row, generator) for row, generator in zip(probs.split(1), generators)])
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
    return (probs / noise).argmax(dim=-1).view(-1, num_samples)


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`logits` [rows, vocab] divided by the temperature, with -inf for the tokens top-k, then
    top-p, then min-p leave out (Hugging Face's warpers, in `generate()`'s order)."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        remove = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p  # keep the one crossing p
        logits = logits.masked_fill(torch.zeros_like(remove).scatter(-1, order, remove), -float("inf"))
    if params.min_p > 0.0:
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), -float("inf"))
    return logits


def exponential_like(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Exp(1) draws shaped like `probs`: torch's `exponential_` stream, faster on the CPU.

    There `exponential_` takes one double uniform u per element from the generator and returns
    -log1p(-u), one element at a time (5 ms for five rows of Whisper's vocabulary here); drawing
    the same uniforms with `uniform_` and transforming them vectorized takes a third of that and
    leaves the generator in the same state. The vectorized log1p may differ from the scalar one
    in the last bit of a double, which rounding to float32 almost always hides."""
    if probs.device.type != "cpu":
        return torch.empty_like(probs).exponential_(generator=generator)
    uniform = torch.empty(probs.shape, dtype=torch.float64).uniform_(generator=generator)
    return uniform.neg_().log1p_().neg_().to(probs.dtype)


def _group_output(g: SequenceGroupMetadata, tokens: torch.Tensor, scores: torch.Tensor,
                  log_normalizer: torch.Tensor, params: SamplingParams) -> GroupOutput:
    """Samples with their log-probabilities (scores minus each row's log-normalizer) and, when
    the request asks for `logprobs`, the likeliest tokens' and the sample's as vLLM's `Logprob`s
    (ranks among all tokens: the top k's 1 to k, the sample's one more than those likelier)."""
    chosen = scores.gather(1, tokens)
    token_logprobs = (chosen - log_normalizer[:, None]).tolist()
    if params.logprobs is not None:
        top_vals, top_ids = scores.topk(params.logprobs, dim=-1)
        top_vals = (top_vals - log_normalizer[:, None]).tolist()
        ranks = ((scores[:, None, :] > chosen[:, :, None]).sum(-1) + 1).tolist()
    samples = []
    top: Any = None
    for row, (seq_id, row_tokens) in enumerate(zip(g.seq_data, tokens.tolist())):
        for k, (token, logprob) in enumerate(zip(row_tokens, token_logprobs[row])):
            if params.logprobs is not None:
                top = logprob_entry(top_ids[row].tolist(), top_vals[row], token, logprob, ranks[row][k])
            samples.append(SequenceOutput(seq_id, token, logprob, top))
    return GroupOutput(g.request_id, samples)
