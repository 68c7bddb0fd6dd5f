"""Summarization inputs and decoding settings, shared by `encdec summarize` and `/v1/summarize`.

An article longer than the encoder's positions is cut to fit, as Hugging Face's tokenizer does
with `truncation=True` (the special tokens that close it kept), unless truncation is refused. A
checkpoint whose config has `task_specific_params["summarization"]["prefix"]` (T5: "summarize: ")
gets it in front of every article. The decoder starts where Hugging Face's generate() starts it,
at <DEC> alone (`Article.prompt`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from encdec.generation_config import GenerationDefaults, task_prefix
from encdec.inputs.long_texts import encode_long
from encdec.inputs.tokenizing import encode
from encdec.sampling.params import RequestOutputKind, SamplingParams

DEFAULT_MAX_TOKENS = 128  # summaries of a checkpoint without any generation config
SUMMARIZATION = "summarization"  # the task of `task_specific_params` (and Hugging Face's pipeline)
# SamplingParams names that the summarization options spell differently
OPTION_NAMES = {"beam_width": "num_beams", "use_beam_search": "num_beams"}


class ArticleTooLong(ValueError):
    """An article over the encoder's limit, with truncation refused."""


@dataclass
class Article:
    token_ids: list[int]
    truncated_tokens: int  # how many tokens were cut off the end
    DECODER_PROMPT_LEN: ClassVar[int] = 1  # `prompt`'s <DEC>

    def prompt(self, decoder_start_token_id: int) -> dict:
        """The engine prompt: the article, and the decoder at <DEC> alone, as Hugging Face's
        summarization pipeline starts it (BART's default decoder prompt, vLLM's [<DEC>, <BOS>],
        differs when the config forces no BOS)."""
        return {"encoder_prompt": {"prompt_token_ids": self.token_ids},
                "decoder_prompt": {"prompt_token_ids": [decoder_start_token_id]}}


def prepare_article(text: str, tokenizer: Any, hf_config: Any, max_tokens: int,
                    truncate: bool = True) -> Article:
    """The encoder token ids of one article, cut to `max_tokens` unless `truncate` is False
    (then ArticleTooLong names the limit). A long text's tail is only counted (`encode_long`)."""
    if not text.strip():
        raise ValueError("the text to summarize is empty")
    ids, count = encode_long(tokenizer, task_prefix(hf_config, SUMMARIZATION) + text, max_tokens)
    return fit_article(ids, tokenizer, max_tokens, truncate, count)


def fit_article(ids: list[int], tokenizer: Any, max_tokens: int, truncate: bool = True,
                count: Optional[int] = None) -> Article:
    """Tokenized text cut to `max_tokens` as `truncation=True` cuts it: the text's end goes,
    the special tokens the tokenizer puts after a text stay (ArticleTooLong if it does not fit
    and `truncate` is False). `count`: the whole text's tokens, where `ids` are its head."""
    count = len(ids) if count is None else count
    if count <= max_tokens:
        return Article(ids, 0)
    if not truncate:
        raise ArticleTooLong(f"the text has {count} tokens, more than the model's limit of "
                             f"{max_tokens} input tokens")
    closing = min(closing_tokens(tokenizer), max_tokens)
    kept = ids[:max_tokens - closing] + ids[len(ids) - closing:]
    return Article(kept, count - len(kept))


def closing_tokens(tokenizer: Any) -> int:
    """How many special tokens the tokenizer puts after a text's own (BART's, T5's </s>: 1)."""
    own = encode(tokenizer, text="a", add_special_tokens=False, verbose=False)
    whole = encode(tokenizer, text="a", verbose=False)
    starts = [i for i in range(len(whole) - len(own) + 1) if whole[i:i + len(own)] == own]
    return len(whole) - len(own) - starts[0] if starts else 0


def summary_params(defaults: GenerationDefaults, max_tokens: Optional[int] = None,
                   min_tokens: Optional[int] = None, num_beams: Optional[int] = None,
                   length_penalty: Optional[float] = None,
                   no_repeat_ngram_size: Optional[int] = None, temperature: Optional[float] = None,
                   top_k: Optional[int] = None, top_p: Optional[float] = None,
                   seed: Optional[int] = None,
                   output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
                   task: Optional[str] = SUMMARIZATION) -> SamplingParams:
    """Decoding settings for summaries: each unset one comes from the checkpoint's generation
    config with its `task` parameters over it (so a bart-large-cnn or t5-small directory decodes
    like Hugging Face's summarization pipeline), also when `temperature` is set: 0 keeps the
    config's beam search, above 0 samples with the config's lengths, `no_repeat_ngram_size` and
    forced tokens. A checkpoint without a config decodes greedily, at most 128 tokens. `top_k`
    and `top_p` shape the sampling: refused with `num_beams` > 1 (as a temperature above 0 is),
    ignored at temperature 0 (as in vLLM) and, with `temperature` unset, where the config does
    not sample (as Hugging Face's pipeline ignores them without `do_sample`)."""
    config = defaults.for_task(task)
    if not config.found:
        temperature = 0.0 if temperature is None else temperature
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
    SamplingParams(top_k=top_k, top_p=top_p)  # their ranges, checked where they are ignored too
    if num_beams is not None and num_beams > 1:
        for name, value, off in (("top_k", top_k, (None, -1, 0)), ("top_p", top_p, (None, 1.0))):
            if value not in off:
                raise ValueError(f"{name}={value}: a beam search of {num_beams} beams does not "
                                 f"sample; leave {name} out, or sample with one beam and a "
                                 f"temperature above 0")
    if not (temperature > 0 if temperature is not None else bool(config.get("do_sample"))):
        top_k = top_p = None
    beams = {} if num_beams is None else dict(beam_width=num_beams, use_beam_search=num_beams > 1)
    return SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, length_penalty=length_penalty,
                          no_repeat_ngram_size=no_repeat_ngram_size, temperature=temperature,
                          top_k=top_k, top_p=top_p, seed=seed, output_kind=output_kind,
                          config_per_field=True, config_task=task, **beams)
