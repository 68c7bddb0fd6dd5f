"""vLLM's beam-search API (`LLM.beam_search(prompts, BeamSearchParams(...))`) over the engine's
beam search, which is Hugging Face's (`encdec.sampling.beam_search`).

The search decodes as a request with `SamplingParams(beam_width=W, n=W, temperature=0)` and
the params' other fields, not the checkpoint's generation config (as vLLM's `beam_search`
ignores it); its `W` hypotheses come back best first. As in vLLM, a sequence's `tokens` are
the decoder prompt's followed by the generated ones; its `text` is the generated text alone
(vLLM decodes the prompt too, which for an encoder/decoder model is only its start tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from encdec.outputs import RequestOutput
from encdec.sampling.params import SamplingParams


@dataclass
class BeamSearchParams:
    """vLLM's fields. `temperature` must stay 0: the search is deterministic."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def sampling_params(self) -> SamplingParams:
        """The engine request's params (a ValueError names a field that does not fit)."""
        return SamplingParams(use_beam_search=True, beam_width=self.beam_width, n=self.beam_width,
                              max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              temperature=self.temperature, length_penalty=self.length_penalty,
                              include_stop_str_in_output=self.include_stop_str_in_output)


@dataclass
class BeamSearchSequence:
    """One finished hypothesis: decoder prompt plus generated tokens, its summed log-probability."""

    tokens: list[int]
    cum_logprob: float
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class BeamSearchOutput:
    """A prompt's hypotheses, best first."""

    sequences: list[BeamSearchSequence]

    @classmethod
    def of(cls, output: RequestOutput) -> "BeamSearchOutput":
        return cls([BeamSearchSequence(list(output.prompt_token_ids) + list(c.token_ids), c.cumulative_logprob,
                                       c.text, c.finish_reason, c.stop_reason) for c in output.outputs])
