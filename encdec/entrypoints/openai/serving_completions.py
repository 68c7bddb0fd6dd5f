"""`POST /v1/completions`: OpenAI's completions API on an encoder/decoder model.

`prompt` (text, texts, token ids or lists of them) goes to the encoder, one engine request per
prompt, all in the engine's one batch; the extra field `decoder_prompt` starts the decoder, and
`source_lang` / `target_lang` make text prompts translations as `encdec translate` makes them
(`encdec.models.registry.translation_inputs`, T5's task parameters, mBART-50's forced target code).
Choice `i * n + k` is completion k of prompt i. `best_of` > n samples best_of completions and
returns the n likeliest. A beam search (`use_beam_search`, or a checkpoint's num_beams when the
request does not sample) returns its n best beams; `best_of` is then the beam width (vLLM's),
which is otherwise the config's num_beams, or n if that is more. Each unset decoding field takes
the checkpoint's generation config, also when `temperature` is set (which then only decides
whether to sample), except that several completions of a prompt are sampled at OpenAI's default
temperature, 1, when the config neither samples nor searches beams. The engine ends a
completion at a stop string and cuts it out of the text; a streamed completion holds back text
that could start one.
vLLM's `prompt_logprobs` scores the decoder prompt; each choice of the prompt carries them, and,
as in vLLM, they are not streamed.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from encdec.config import SchedulerConfig
from encdec.engine.async_engine import Admission
from encdec.engine.detokenizer import IncrementalDetokenizer
from encdec.entrypoints.openai.errors import bad_request
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.protocol import (CompletionChoice, CompletionLogProbs,
                                                CompletionRequest, CompletionResponse, PromptLogprob,
                                                UsageInfo, unix_time)
from encdec.entrypoints.openai.serving_engine import (Generated, OutputCounter, bad_input, collect,
                                                     random_id, tokenize_off_loop)
from encdec.entrypoints.openai.serving_models import ServedModel, ServedModels
from encdec.entrypoints.openai.streaming import (DONE, cancel_on_disconnect, event_stream,
                                                 merge_async_iterators, sse)
from encdec.generation_config import GenerationDefaults
from encdec.inputs.long_texts import PIECE_CHARS, encode_long
from encdec.inputs.preprocess import truncate_prompt
from encdec.models.registry import LanguageError, TranslationInputs, translation_inputs, translation_task
from encdec.outputs import PromptLogprobs, SampleLogprobs
from encdec.sampling.params import RequestOutputKind, SamplingParams

ENGINE_NAMES = {"encoder_prompt": "prompt", "beam_width": "best_of"}
LOWEST_LOGPROB = -9999.0  # what vLLM sends for -inf
OPENAI_TEMPERATURE = 1.0  # the API's default


def sampling_params(body: CompletionRequest, vocab_size: int, defaults: GenerationDefaults,
                    scheduler_config: SchedulerConfig) -> SamplingParams:
    """The engine's settings for every prompt of `body` (see the module docstring)."""
    for name, unsupported in (("echo", body.echo), ("suffix", body.suffix is not None)):
        if unsupported:
            raise bad_request(f"{name} is not supported by encoder/decoder completions", name)
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only for stream=true", "stream_options")
    if body.stream and body.prompt_logprobs is not None:
        raise bad_request("prompt_logprobs are not available with stream=true", "prompt_logprobs")
    task = translation_task(body.source_lang, body.target_lang)
    defaults = defaults.for_task(task)
    best_of = body.best_of or body.n
    field = "best_of" if body.best_of else "n"
    if best_of < body.n:
        raise bad_request(f"best_of={best_of} must be >= n={body.n}", "best_of")
    temperature, beam_width = body.temperature, None
    if searches_beams(body, defaults):  # best_of > 1 is the beam width (vLLM's), else the config's
        config_beams = defaults.get("num_beams") if defaults.found else 1
        beam_width = body.best_of if (body.best_of or 1) > 1 else max(body.n, config_beams)
        if beam_width < 2:
            raise bad_request("beam search needs a beam width >= 2: set best_of (the checkpoint's "
                              f"num_beams is {config_beams})", "best_of")
        field = "n" if body.n == beam_width > config_beams else "best_of"
        asked = f"a beam width of {beam_width}"
    elif body.stream and best_of > body.n:
        raise bad_request("best_of > n cannot be streamed", "best_of")
    elif best_of > 1 and temperature == 0:
        raise bad_request(f"{field}={best_of} needs random sampling or use_beam_search: set "
                          f"temperature > 0 (greedy decoding would give {best_of} identical "
                          f"completions)", field)
    else:
        if best_of > 1 and temperature is None and not defaults.get("do_sample"):
            temperature = OPENAI_TEMPERATURE
        asked = f"{field}={best_of}"
    try:
        scheduler_config.check_num_seqs(beam_width or best_of, asked)
    except ValueError as error:
        raise bad_request(str(error), field) from None
    with bad_input(CompletionRequest, ENGINE_NAMES, None):
        return SamplingParams(
            n=body.n if beam_width else best_of, beam_width=beam_width,
            max_tokens=body.max_tokens, min_tokens=body.min_tokens,
            temperature=temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, seed=body.seed,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
            logprobs=body.logprobs, prompt_logprobs=body.prompt_logprobs,
            stop=body.stop, include_stop_str_in_output=body.include_stop_str_in_output,
            repetition_penalty=body.repetition_penalty, stop_token_ids=body.stop_token_ids,
            bad_words=body.bad_words, allowed_token_ids=body.allowed_token_ids,
            ignore_eos=body.ignore_eos, skip_special_tokens=body.skip_special_tokens,
            truncate_prompt_tokens=body.truncate_prompt_tokens, use_beam_search=body.use_beam_search,
            length_penalty=body.length_penalty,
            logit_bias=logit_bias(body.logit_bias, vocab_size) if body.logit_bias else None,
            output_kind=RequestOutputKind.DELTA, config_per_field=True, config_task=task)


def searches_beams(body: CompletionRequest, defaults: GenerationDefaults) -> bool:
    """Whether `body` decodes with beam search: `use_beam_search` when set, else the checkpoint's
    num_beams unless the request samples (temperature > 0, or unset with a sampling config)."""
    if body.use_beam_search is not None:
        return body.use_beam_search
    return defaults.searches_beams(None if body.temperature is None else body.temperature > 0)


def logit_bias(bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    """OpenAI's `logit_bias` (token ids as JSON keys, biases in [-100, 100]) as the engine's."""
    parsed = {}
    for token, value in bias.items():
        if not (token.isascii() and token.isdigit() and len(token) <= 9) or int(token) >= vocab_size:
            raise bad_request(f"logit_bias: {token[:20]!r} is not a token id of this model "
                              f"(vocab_size={vocab_size})", "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"logit_bias: {value} is outside [-100, 100]", "logit_bias")
        parsed[int(token)] = value
    return parsed


class OpenAIServingCompletion:
    def __init__(self, models: ServedModels, metrics: ServerMetrics):
        self.models, self.metrics = models, metrics

    async def create(self, body: CompletionRequest, request: Request) -> Response:
        served = self.models.get(body.model, whisper=False)
        engine = served.engine.engine
        params = sampling_params(body, engine.model_config.vocab_size, engine.generation_defaults,
                                 engine.scheduler_config)
        prompts, forced_bos = await encoder_prompts(served, body)
        if forced_bos is not None:  # mBART-50's target language, generated first
            params = dataclasses.replace(params, forced_bos_token_id=forced_bos)
        response_id = random_id("cmpl")
        counter = OutputCounter(self.metrics, served.name, request)
        admission = Admission(len(prompts))  # the prompts are taken or refused (429) together
        merged = merge_async_iterators(*(served.engine.generate(prompt, params, f"{response_id}-{i}",
                                                               admission=admission)
                                         for i, prompt in enumerate(prompts)))
        with bad_input(CompletionRequest, ENGINE_NAMES, "prompt"):
            if body.stream:
                return await event_stream(request, self._chunks(served, body, response_id, merged, counter),
                                          admission)
            choices, prompt_logprobs = await cancel_on_disconnect(
                request, collect(merged, counter, len(prompts), params.n))
        return JSONResponse(CompletionResponse(
            id=response_id, model=body.model,
            choices=self._choices(served, body, choices, prompt_logprobs),
            usage=counter.usage()).model_dump(exclude_none=True))

    @staticmethod
    def _choices(served: ServedModel, body: CompletionRequest, generated: list[list[Generated]],
                 prompt_logprobs: list[Optional[PromptLogprobs]]) -> list[CompletionChoice]:
        choices = []
        for completions, scored in zip(generated, prompt_logprobs):
            if len(completions) > body.n:  # best_of: the likeliest n
                completions = sorted(completions, key=lambda g: g.cumulative_logprob, reverse=True)[:body.n]
            for g in completions:
                logprobs = (None if body.logprobs is None else LogprobsBuilder.of(
                    served.engine.tokenizer, body).add(g.token_ids, g.logprobs, finished=True))
                choices.append(CompletionChoice(
                    index=len(choices), text=g.text, logprobs=logprobs, finish_reason=g.finish_reason,
                    stop_reason=g.stop_reason,
                    prompt_logprobs=None if scored is None else json_prompt_logprobs(scored)))
        return choices

    @staticmethod
    async def _chunks(served: ServedModel, body: CompletionRequest, response_id: str, merged,
                      counter: OutputCounter) -> AsyncIterator[str]:
        builders: dict[int, LogprobsBuilder] = {}
        created = unix_time()  # one time for every chunk, as OpenAI streams
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        continuous = include_usage and body.stream_options.continuous_usage_stats  # vLLM's: both
        generated: dict[int, int] = {}  # each choice's tokens so far
        async for i, out in merged:
            counter.count(out)
            prompt_tokens = len(out.encoder_prompt_token_ids) + len(out.prompt_token_ids)
            for delta in out.outputs:  # a chunk per choice with something to send, as OpenAI streams
                index = i * body.n + delta.index
                generated[index] = generated.get(index, 0) + len(delta.token_ids)
                logprobs = None
                if body.logprobs is not None:  # the same pieces and offsets as without streaming
                    builder = builders.setdefault(index, LogprobsBuilder.of(served.engine.tokenizer, body))
                    logprobs = builder.add(delta.token_ids, delta.logprobs or [], delta.finish_reason is not None)
                if delta.text or delta.finish_reason or (logprobs is not None and logprobs.tokens):
                    choice = CompletionChoice(index=index, text=delta.text, logprobs=logprobs,
                                              finish_reason=delta.finish_reason, stop_reason=delta.stop_reason)
                    usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=generated[index],
                                      total_tokens=prompt_tokens + generated[index]) if continuous else None
                    chunk = CompletionResponse(id=response_id, created=created, model=body.model,
                                               choices=[choice], usage=usage)
                    # With include_usage, OpenAI's other chunks carry a null usage (vLLM's
                    # continuous_usage_stats: the chunk's prompt and its choice's tokens so far).
                    yield sse(chunk.model_dump(exclude_none=True) | {"usage": None}
                              if include_usage and not continuous else chunk)
        if include_usage:
            yield sse(CompletionResponse(id=response_id, created=created, model=body.model, choices=[],
                                         usage=counter.usage()))
        yield DONE


async def encoder_prompts(served: ServedModel, body: CompletionRequest) -> tuple[list[Any], Optional[int]]:
    """The engine prompts of `body`, and the token a translation forces first (mBART-50's
    target language) if any: text tokenized here (off the event loop), every prompt checked
    against the encoder's limit and the vocabulary before it reaches the engine."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt is empty", "prompt")
    engine = served.engine
    texts = [p for p in prompt if isinstance(p, str)]
    if any(not t for t in texts):
        raise bad_request("prompt contains an empty string", "prompt")
    if texts and engine.tokenizer is None:
        raise bad_request("this model has no tokenizer: send token ids", "prompt")
    limit, vocab = engine.model_config.max_encoder_len, engine.model_config.encoder_vocab_size
    truncated = body.truncate_prompt_tokens is not None
    keep = limit if body.truncate_prompt_tokens in (None, -1) else body.truncate_prompt_tokens
    forced_bos = None
    if body.source_lang is not None or body.target_lang is not None:
        translations = await translations_of(served, body, prompt)
        encoded = iter((t.prompt_token_ids, len(t.prompt_token_ids)) for t in translations)
        forced_bos = translations[0].forced_bos_token_id
    else:
        encoded = iter(await tokenize_off_loop(
            lambda: [encode_long(engine.tokenizer, t, keep, from_end=truncated) for t in texts], texts))
    prompts = []
    for i, given in enumerate(prompt):
        ids, count = next(encoded) if isinstance(given, str) else (given, len(given))
        if truncated:
            try:
                ids = truncate_prompt(ids, body.truncate_prompt_tokens, limit)
            except ValueError as err:
                raise bad_request(str(err), "truncate_prompt_tokens") from None
            count = len(ids)
        if not ids or count > limit:
            raise bad_request(f"prompt {i} has {count} tokens; the model takes 1 to {limit}", "prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"prompt {i} has token ids outside the vocabulary [0, {vocab})", "prompt")
        tokens = {"prompt_token_ids": list(ids)}
        prompts.append(tokens if body.decoder_prompt is None else
                       {"encoder_prompt": tokens, "decoder_prompt": decoder_prompt(body.decoder_prompt)})
    return prompts, forced_bos


async def translations_of(served: ServedModel, body: CompletionRequest, prompts: list[Any]) -> list[TranslationInputs]:
    """The text `prompts` as the checkpoint translates them from `source_lang` into
    `target_lang` (`encdec.models.registry.translation_inputs`); a language it cannot take, or
    a target it does not use, is a 400 naming the field."""
    named = "target_lang" if body.target_lang is not None else "source_lang"
    if not all(isinstance(p, str) for p in prompts):
        raise bad_request(f"{named} translates text prompts; token ids are the model's input as they are", named)
    if body.decoder_prompt is not None:
        raise bad_request(f"decoder_prompt cannot be combined with {named}: the translation sets the "
                          f"decoder's start", "decoder_prompt")
    if body.truncate_prompt_tokens is not None:
        raise bad_request(f"truncate_prompt_tokens cannot be combined with {named}: it keeps a prompt's "
                          f"last tokens, which would drop the translation's own", "truncate_prompt_tokens")
    engine = served.engine
    limit = engine.model_config.max_encoder_len

    def translate(i: int, text: str) -> TranslationInputs:
        if len(text) > PIECE_CHARS:  # counted in pieces first: tokenizing it whole could take gigabytes
            count = encode_long(engine.tokenizer, text, limit)[1]
            if count > limit:
                raise bad_request(f"prompt {i} has {count} tokens; the model takes 1 to {limit}", "prompt")
        return translation_inputs(engine.tokenizer, engine.model_config.hf_config, text, body.source_lang,
                                  body.target_lang)

    try:
        translations = await tokenize_off_loop(lambda: [translate(i, text) for i, text in enumerate(prompts)],
                                               prompts)
    except LanguageError as err:
        raise bad_request(str(err), err.field) from None
    except ValueError as err:  # the checkpoint does not translate
        raise bad_request(str(err), "model") from None
    unused = dict(translations[0].unused)
    if "target_lang" in unused:  # a one-pair model asked for another target
        raise bad_request(f"target_lang {body.target_lang!r}: {unused['target_lang']}", "target_lang")
    return translations


def json_prompt_logprobs(scored: PromptLogprobs) -> list[Optional[dict[int, PromptLogprob]]]:
    """vLLM's prompt_logprobs in JSON (which has no -inf: LOWEST_LOGPROB)."""
    return [None if entry is None else
            {token: PromptLogprob(logprob=max(e.logprob, LOWEST_LOGPROB), rank=e.rank, decoded_token=e.decoded_token)
             for token, e in entry.items()}
            for entry in scored]


def decoder_prompt(prompt: Any) -> Any:
    return prompt if isinstance(prompt, str) else {"prompt_token_ids": prompt}


class LogprobsBuilder:
    """OpenAI's logprobs of one completion, a few tokens at a time. Each token is shown as its
    piece of the completion's text (as vLLM's detokenizer shows it: "" for a special token
    unless `skip_special_tokens` is False, a character split over tokens on its last one), so
    the pieces add up to the text and `text_offset` indexes into it (as in vLLM, the text a stop
    string or stop token cut off still has its pieces). The `top` likeliest alternatives (and
    the token itself) are keyed by the piece each would have added (one entry a piece), or with
    `as_token_ids` (vLLM's `return_tokens_as_token_ids`, and always for a model without a
    tokenizer, whose text is empty) every token by "token_id:{id}". JSON has no -inf: a token
    ruled out (a forced token's alternatives) gets LOWEST_LOGPROB."""

    def __init__(self, tokenizer: Any, top: int, skip_special_tokens: bool = True, as_token_ids: bool = False):
        self.detokenizer = None if tokenizer is None else IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.as_token_ids = as_token_ids or tokenizer is None
        self.top, self.ids, self.offset = top, [], 0

    @classmethod
    def of(cls, tokenizer: Any, body: CompletionRequest) -> LogprobsBuilder:
        """The builder `body` asks for."""
        return cls(tokenizer, body.logprobs, body.skip_special_tokens, body.return_tokens_as_token_ids)

    def add(self, token_ids: list[int], logprobs: SampleLogprobs, finished: bool) -> CompletionLogProbs:
        """The logprobs of the next tokens (`finished`: they end the completion)."""
        result = CompletionLogProbs()
        for k, (token, entries) in enumerate(zip(token_ids, logprobs)):
            last = finished and k == len(token_ids) - 1
            candidates = {t: e.logprob for t, e in entries.items()}
            best = dict(sorted(candidates.items(), key=lambda kv: kv[1], reverse=True)[:self.top])
            best.setdefault(token, candidates[token])  # as OpenAI's: the sampled token is always there
            if self.as_token_ids:
                pieces = {t: f"token_id:{t}" for t in best}
            else:  # what each alternative would have added
                pieces = {t: copy.copy(self.detokenizer).step([*self.ids, t], last) for t in best if t != token}
            self.ids.append(token)
            # the text's own piece, for the offsets
            piece = "" if self.detokenizer is None else self.detokenizer.step(self.ids, last)
            pieces.setdefault(token, piece)
            result.tokens.append(pieces[token])
            result.token_logprobs.append(max(candidates[token], LOWEST_LOGPROB))
            top: dict[str, float] = {}
            for t, lp in best.items():  # two tokens of one piece: the sampled one, else the likelier
                if t == token or (pieces[t] != pieces[token] and pieces[t] not in top):
                    top[pieces[t]] = max(lp, LOWEST_LOGPROB)
            result.top_logprobs.append(top)
            result.text_offset.append(self.offset)
            self.offset += len(piece)
        return result


