"""Built-in logits processors, each a small function over many rows of a batch at once.

`apply_logits_processors` runs them in Hugging Face's order (repetition penalty, then vLLM's
presence and frequency penalties, no-repeat n-gram, bad words, min tokens, forced BOS, forced
EOS, suppressed tokens, suppressed at the beginning), then vLLM's logit bias and allowed
tokens, then each request's own processors (row by row, or together where their class can).
A row's history is its decoder prompt plus its output, as Hugging Face's `input_ids` in
`generate()`. The scores are logits for greedy and sampled rows and log-probabilities for beam
rows, exactly where Hugging Face applies them. Every function modifies `scores` in place.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from encdec.inputs.tokenizing import encode
from encdec.sampling.params import SamplingParams
from encdec.sequence import SequenceData

Row = tuple[SequenceData, SamplingParams]


def apply_logits_processors(scores: torch.Tensor, rows: Sequence[Row],
                            eos_token_id: Optional[int]) -> dict[int, Exception]:
    """Process `scores` [len(rows), vocab] in place; `rows` hold resolved SamplingParams.
    Returns the rows whose own processors failed (raised, or returned something other than
    the row), with the error: their requests fail alone."""
    apply_penalties(scores, list(range(len(rows))), [p for _, p in rows],
                    lambda i: rows[i][0].get_token_ids(), lambda i: rows[i][0].output_token_ids)
    _ban(scores, [(i, t) for i, (data, p) in enumerate(rows) if p.bad_words_ids
                  for t in bad_word_ends(data.get_token_ids(), p.bad_words_ids, eos_token_id)])
    _ban(scores, [(i, t) for i, (data, p) in enumerate(rows)
                  if len(data.output_token_ids) < p.min_tokens for t in _stop_ids(p, eos_token_id)])
    for forced in ([(i, p.forced_bos_token_id) for i, (data, p) in enumerate(rows)
                    if p.forced_bos_token_id is not None and len(data) == 1],
                   [(i, p.forced_eos_token_id) for i, (data, p) in enumerate(rows)
                    if p.forced_eos_token_id is not None
                    and len(data.output_token_ids) == p.max_tokens - 1]):
        if forced:
            force_tokens(scores, [i for i, _ in forced], [t for _, t in forced])
    _ban(scores, [(i, t) for i, (_, p) in enumerate(rows) for t in p.suppress_tokens or []])
    _ban(scores, [(i, t) for i, (data, p) in enumerate(rows) if p.begin_suppress_tokens
                  and len(data.output_token_ids) == _first_free_step(data, p)
                  for t in p.begin_suppress_tokens])
    for i, (_, p) in enumerate(rows):
        if p.logit_bias:
            scores[i, list(p.logit_bias)] += torch.tensor(list(p.logit_bias.values()), dtype=scores.dtype,
                                                          device=scores.device)
        if p.allowed_token_ids is not None:
            allowed = scores[i, p.allowed_token_ids]
            scores[i] = -float("inf")
            scores[i, p.allowed_token_ids] = allowed
    return _request_processors(scores, rows)


def _request_processors(scores: torch.Tensor, rows: Sequence[Row]) -> dict[int, Exception]:
    """Each request's own processors, in order. A processor with a static `process_batch(scores,
    rows, histories, processors)` runs as one call for all the rows that have one of its class
    at the same place in their list; the others run row by row. A row whose processor fails
    runs no more of them."""
    failed: dict[int, Exception] = {}
    depth = max((len(p.logits_processors) for _, p in rows), default=0)
    for place in range(depth):
        together: dict[type, list[int]] = {}
        for i, (data, p) in enumerate(rows):
            if place >= len(p.logits_processors) or i in failed:
                continue
            processor = p.logits_processors[place]
            if hasattr(processor, "process_batch"):
                together.setdefault(type(processor), []).append(i)
                continue
            try:
                history = (data.prompt_token_ids, data.output_token_ids) if p.processors_take_prompt[place] \
                    else (data.output_token_ids,)
                row = processor(*history, scores[i])
                if not isinstance(row, torch.Tensor) or row.shape != scores[i].shape:
                    raise TypeError(f"logits processor {processor!r} returned {type(row).__name__} "
                                    f"{tuple(getattr(row, 'shape', ()))}; it must return the logits "
                                    f"row, a tensor of shape {tuple(scores[i].shape)}")
                scores[i] = row
            except Exception as err:  # the user's code: its request fails, not the batch
                failed[i] = err
        for kind, picked in together.items():
            try:
                kind.process_batch(scores, picked, [rows[i][0].output_token_ids for i in picked],
                                   [rows[i][1].logits_processors[place] for i in picked])
            except Exception as err:
                failed.update(dict.fromkeys(picked, err))
    return failed


def apply_penalties(scores: torch.Tensor, rows: list[int], settings: Sequence[Any],
                    history: Callable[[int], list[int]], output: Callable[[int], list[int]]) -> None:
    """The penalties of `settings[k]` (named as in SamplingParams) on row `rows[k]`, in Hugging
    Face's order: repetition penalty, presence and frequency penalties, no-repeat n-grams. The
    first and the last count `history(k)`, the others `output(k)`."""
    picked = [k for k, s in enumerate(settings) if s.repetition_penalty != 1.0]
    if picked:
        repetition_penalty(scores, [rows[k] for k in picked], [history(k) for k in picked],
                           [settings[k].repetition_penalty for k in picked])
    picked = [k for k, s in enumerate(settings) if s.presence_penalty or s.frequency_penalty]
    if picked:
        presence_frequency_penalties(scores, [rows[k] for k in picked], [output(k) for k in picked],
                                     [settings[k].presence_penalty for k in picked],
                                     [settings[k].frequency_penalty for k in picked])
    for size in sorted({s.no_repeat_ngram_size for s in settings if s.no_repeat_ngram_size}):
        picked = [k for k, s in enumerate(settings) if s.no_repeat_ngram_size == size]
        ban_repeated_ngrams(scores, [rows[k] for k in picked], [history(k) for k in picked], size)


def repetition_penalty(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                       penalties: list[float]) -> None:
    """Scores of tokens already in a row's history: divided by its penalty when positive,
    multiplied when negative (CTRL, as Hugging Face)."""
    vocab = scores.shape[-1]
    seen = torch.zeros(len(rows), vocab + 1, dtype=torch.bool)
    seen.scatter_(1, _pad(histories, vocab), True)
    picked = scores[rows]
    penalty = torch.tensor(penalties, dtype=scores.dtype, device=scores.device)[:, None]
    penalized = torch.where(picked < 0, picked * penalty, picked / penalty)
    scores[rows] = torch.where(seen[:, :vocab].to(scores.device), penalized, picked)


def presence_frequency_penalties(scores: torch.Tensor, rows: list[int], outputs: list[list[int]],
                                 presence: list[float], frequency: list[float]) -> None:
    """OpenAI's penalties: the score of a token a row has generated c times drops by its
    presence penalty plus c times its frequency penalty (only generated tokens count, as in
    vLLM; not the prompt)."""
    vocab = scores.shape[-1]
    index = _pad(outputs, vocab)
    counts = torch.zeros(len(rows), vocab + 1, dtype=scores.dtype)
    counts.scatter_add_(1, index, torch.ones(index.shape, dtype=scores.dtype))
    counts = counts[:, :vocab].to(scores.device)
    presence_t = torch.tensor(presence, dtype=scores.dtype, device=scores.device)[:, None]
    frequency_t = torch.tensor(frequency, dtype=scores.dtype, device=scores.device)[:, None]
    scores[rows] -= presence_t * (counts > 0) + frequency_t * counts


def ban_repeated_ngrams(scores: torch.Tensor, rows: list[int], histories: list[list[int]],
                        size: int) -> None:
    """Ban every token that would repeat an n-gram of `size` already in a row's history."""
    lengths = torch.tensor([len(h) for h in histories])
    tokens = _pad(histories, -1, left=True)  # each row's last n-1 tokens line up at the end
    if tokens.shape[1] < size:
        return
    windows = tokens.unfold(1, size, 1)  # [rows, num_windows, size]
    prefix = tokens[:, tokens.shape[1] - size + 1:]
    # a window that starts in the padding is not an n-gram (for size 1 it would match nothing)
    inside = torch.arange(windows.shape[1])[None, :] >= (tokens.shape[1] - lengths)[:, None]
    matches = (windows[..., :-1] == prefix[:, None, :]).all(-1) & inside
    vocab = scores.shape[-1]
    banned = torch.zeros(len(rows), vocab + 1, dtype=torch.bool)
    banned.scatter_(1, torch.where(matches, windows[..., -1], vocab), True)
    picked = scores[rows]
    scores[rows] = picked.masked_fill(banned[:, :vocab].to(scores.device), -float("inf"))


def bad_word_ends(history: list[int], bad_words_ids: list[list[int]],
                  eos_token_id: Optional[int]) -> list[int]:
    """The last tokens of the bad words whose other tokens end `history` (Hugging Face's
    `NoBadWordsLogitsProcessor`: a lone EOS is never a bad word)."""
    return [word[-1] for word in bad_words_ids if word != [eos_token_id]
            and (len(word) == 1 or history[len(history) - len(word) + 1:] == word[:-1])]


def bad_words_token_ids(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """vLLM's `bad_words` as token sequences of the output's vocabulary: each word's tokens at
    the start of a text, and after a space where that starts with another token of the same
    count (byte-level BPE's "Ġword"; SentencePiece's are the same)."""
    sequences = []
    for word in words:
        bare, spaced = (encode(tokenizer, text_target=text, add_special_tokens=False)
                        for text in (word.lstrip(), " " + word.lstrip()))
        if not bare:
            raise ValueError(f"bad_words: {word!r} has no tokens")
        sequences.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences


def _first_free_step(data: SequenceData, params: SamplingParams) -> int:
    """The first generated token not forced: after a forced BOS that follows a lone <DEC>, the second."""
    return int(params.forced_bos_token_id is not None and len(data.prompt_token_ids) == 1)


def _ban(scores: torch.Tensor, bans: list[tuple[int, int]]) -> None:
    if bans:
        ban_tokens(scores, [i for i, _ in bans], [t for _, t in bans])


def ban_tokens(scores: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
    """Set scores[rows[i], tokens[i]] to -inf."""
    scores[torch.tensor(rows), torch.tensor(tokens)] = -float("inf")


def force_tokens(scores: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
    """Row rows[i] can only choose tokens[i]: its score 0, every other -inf."""
    index = torch.tensor(rows)
    scores[index] = -float("inf")
    scores[index, torch.tensor(tokens)] = 0.0


def _stop_ids(params: SamplingParams, eos_token_id: Optional[int]) -> list[int]:
    ids = list(params.stop_token_ids)
    if eos_token_id is not None and not params.ignore_eos:
        ids.append(eos_token_id)
    return ids


def _pad(rows: list[list[int]], fill: int, left: bool = False) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([[fill] * (width - len(r)) + r if left else r + [fill] * (width - len(r))
                         for r in rows], dtype=torch.long)
