"""`POST /v1/summarize`: summaries of one or more articles, one engine request each.

Articles are truncated to the encoder's positions (and each summary says how many tokens were
cut) unless `truncate` is false; unset decoding fields take the checkpoint's generation config
(`encdec.entrypoints.summaries`). `stream: true` sends SSE chunks of text deltas per index,
then a usage chunk and `data: [DONE]`.
"""
from __future__ import annotations

from typing import AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from encdec.engine.async_engine import Admission
from encdec.entrypoints.openai.errors import bad_request
from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.protocol import (SummarizeRequest, SummarizeResponse, Summary,
                                                UsageInfo, unix_time)
from encdec.entrypoints.openai.serving_engine import (OutputCounter, bad_input, collect, random_id,
                                                     tokenize_off_loop)
from encdec.entrypoints.openai.serving_models import ServedModel, ServedModels
from encdec.entrypoints.openai.streaming import (DONE, cancel_on_disconnect, event_stream,
                                                 merge_async_iterators, sse)
from encdec.entrypoints.summaries import OPTION_NAMES, Article, prepare_article, summary_params
from encdec.sampling.params import RequestOutputKind

ENGINE_NAMES = {**OPTION_NAMES, "encoder_prompt": "input"}


class OpenAIServingSummarize:
    def __init__(self, models: ServedModels, metrics: ServerMetrics):
        self.models, self.metrics = models, metrics

    async def create(self, body: SummarizeRequest, request: Request) -> Response:
        served = self.models.get(body.model, whisper=False)
        articles = await self._articles(served, body)
        with bad_input(SummarizeRequest, ENGINE_NAMES, "input"):
            params = summary_params(
                served.engine.engine.generation_defaults, max_tokens=body.max_tokens,
                min_tokens=body.min_tokens, num_beams=body.num_beams, length_penalty=body.length_penalty,
                no_repeat_ngram_size=body.no_repeat_ngram_size, temperature=body.temperature,
                top_k=body.top_k, top_p=body.top_p, seed=body.seed, output_kind=RequestOutputKind.DELTA)
            response_id = random_id("sum")
            counter = OutputCounter(self.metrics, served.name, request)
            admission = Admission(len(articles))  # the articles are taken or refused (429) together
            start = served.engine.model_config.decoder_start_token_id
            merged = merge_async_iterators(*(
                served.engine.generate(a.prompt(start), params, f"{response_id}-{i}",
                                       admission=admission)
                for i, a in enumerate(articles)))
            if body.stream:
                return await event_stream(request, self._chunks(body, response_id, articles, merged, counter),
                                          admission)
            generated, _ = await cancel_on_disconnect(request, collect(merged, counter, len(articles)))
        summaries = [summary(i, g.text, g.finish_reason, a) for i, ([g], a) in enumerate(zip(generated, articles))]
        return JSONResponse(SummarizeResponse(id=response_id, model=body.model, summaries=summaries,
                                              usage=counter.usage()).model_dump(exclude_none=True))

    @staticmethod
    async def _articles(served: ServedModel, body: SummarizeRequest) -> list[Article]:
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise bad_request("input is empty: give a text or a list of texts", "input")
        engine = served.engine
        if engine.tokenizer is None:
            raise bad_request(f"model {served.name!r} has no tokenizer to read text", "model")

        def prepare() -> list[Article]:
            articles = []
            for i, text in enumerate(texts):
                try:
                    articles.append(prepare_article(text, engine.tokenizer, engine.model_config.hf_config,
                                                    engine.model_config.max_encoder_len, body.truncate))
                except ValueError as err:
                    if isinstance(body.input, str):
                        raise
                    raise ValueError(f"input {i}: {err}") from err  # which of the list it is
            return articles

        with bad_input(SummarizeRequest, {}, "input"):
            return await tokenize_off_loop(prepare, texts)

    @staticmethod
    async def _chunks(body: SummarizeRequest, response_id: str, articles: list[Article], merged,
                      counter: OutputCounter) -> AsyncIterator[str]:
        created = unix_time()  # one time for every chunk

        def chunk(summaries: list[Summary], usage: Optional[UsageInfo] = None) -> str:
            return sse(SummarizeResponse(id=response_id, object="summary.chunk", created=created,
                                         model=body.model, summaries=summaries, usage=usage))

        async for i, out in merged:
            counter.count(out)
            # a piece per summary with something to say: text, or its end
            summaries = [summary(i, d.text, d.finish_reason, articles[i]) for d in out.outputs
                         if d.text or d.finish_reason]
            if summaries:
                yield chunk(summaries)
        yield chunk([], counter.usage())
        yield DONE


def summary(index: int, text: str, finish_reason, article: Article) -> Summary:
    """A summary (or a streamed piece of one); the last piece says how the input was read."""
    done = finish_reason is not None
    return Summary(index=index, text=text, finish_reason=finish_reason,
                   input_tokens=len(article.token_ids) if done else None,
                   truncated_tokens=article.truncated_tokens if done else None)
