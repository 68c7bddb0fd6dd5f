"""`beam_rules="whisper"`: openai-whisper's `BeamSearchDecoder` step by step (the transcripts
themselves are checked against openai-whisper in tests/whisper/test_openai_whisper_parity.py)."""
from __future__ import annotations

from dataclasses import dataclass

from encdec import SamplingParams
from encdec.sampling.beam_search import BeamSearch

EOT = 0


@dataclass
class Candidate:
    parent_seq_id: int
    token_id: int
    beam_score: float


def search(width: int = 2, max_tokens: int = 10, **options) -> BeamSearch:
    return BeamSearch(SamplingParams(temperature=0.0, beam_width=width, max_tokens=max_tokens,
                                     beam_rules="whisper", n=width, use_beam_search=True,
                                     **options))


def test_end_tokens_before_the_last_kept_beam_finish():
    """Ranked A, <eot>, <eot>, B: both ends come before the second running beam, so both
    finish (Hugging Face's rules take ends among the first `beam_width` ranks only)."""
    beams = search()
    ranked = [Candidate(1, 7, -1.0), Candidate(1, EOT, -1.5), Candidate(2, EOT, -2.0), Candidate(2, 9, -2.5)]
    assert beams.step(ranked, {1: [5], 2: [6]}, lambda c: c.token_id == EOT) == []
    assert beams.done
    # scored by the sum over the tokens before <eot> (one each here), best first
    assert [(h.token_ids, h.score, h.finish_reason) for h in beams.best(2)] == [
        ([5, EOT], -1.5, "stop"), ([6, EOT], -2.0, "stop")]


def test_finished_hypotheses_are_first_come_and_not_replaced():
    beams = search(patience=1.0)
    assert beams.step([Candidate(1, EOT, -3.0), Candidate(1, 7, -3.5), Candidate(2, 8, -4.0)],
                      {1: [5], 2: [6]}, lambda c: c.token_id == EOT) == [Candidate(1, 7, -3.5), Candidate(2, 8, -4.0)]
    ranked = [Candidate(1, EOT, -3.6), Candidate(2, EOT, -3.7), Candidate(1, 9, -5.0), Candidate(2, 9, -6.0)]
    assert beams.step(ranked, {1: [5, 7], 2: [6, 8]}, lambda c: c.token_id == EOT) == []
    # the second step's better-scored second end does not displace the first step's
    assert [h.token_ids for h in beams.finished] == [[5, EOT], [5, 7, EOT]]
    assert [h.score for h in beams.best(2)] == [-3.6 / 2, -3.0]


def test_running_beams_make_up_the_hypotheses_at_max_tokens():
    beams = search(max_tokens=2)
    ranked = [Candidate(1, 7, -1.0), Candidate(2, 8, -2.0), Candidate(1, EOT, -9.0)]
    assert beams.step(ranked, {1: [5], 2: [6]}, lambda c: c.token_id == EOT) == []
    assert [(h.token_ids, h.score, h.finish_reason) for h in beams.best(2)] == [
        ([5, 7], -0.5, "length"), ([6, 8], -1.0, "length")]
