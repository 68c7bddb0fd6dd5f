"""Prometheus metrics at `/metrics`: traffic counted as it happens, engine state read at scrape;
and the periodic stats line in the log, read from them.

Engine gauges read public engine state only (scheduler queues, block manager counts) from the
event loop while the engine thread runs, without a lock: a scrape may see a step half done.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter as Tally
from typing import TYPE_CHECKING, Iterator, Optional

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from encdec.entrypoints.openai.serving_models import ServedModels
from encdec.outputs import CompletionOutput, RequestOutput

if TYPE_CHECKING:
    from encdec.entrypoints.openai.middleware import ServerState  # which imports this module

logger = logging.getLogger("encdec.server")
STATS_INTERVAL_SECONDS = 10.0  # vLLM's
# to an hour's upload (--max-audio-seconds), whose transcription takes minutes on a CPU
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
                   1280.0, 2560.0)
FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)  # vLLM's, and longer
OUTPUT_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                        2.5, 5.0, 10.0, 20.0)


class EngineCollector:
    """Requests running / waiting / swapped, KV blocks in use, preemptions and aborts, per model."""

    def __init__(self, models: ServedModels):
        self.models = models

    def collect(self) -> Iterator[Metric]:
        gauges = {name: GaugeMetricFamily(f"encdec_{name}", help_, labels=labels) for name, help_, labels in (
            ("num_requests_running", "Requests decoding now.", ["model"]),
            ("num_requests_waiting", "Requests queued, not yet running.", ["model"]),
            ("num_requests_swapped", "Requests preempted to swap space.", ["model"]),
            ("kv_blocks_in_use", "Device KV cache blocks held by requests, by attention kind.",
             ["model", "attention"]),
            ("kv_swap_blocks_in_use", "Swap-space KV blocks held by preempted requests.", ["model"]),
            ("kv_blocks_capacity", "KV cache blocks on the device, in use or free.", ["model"]),
        )}
        preemptions = CounterMetricFamily("encdec_num_preemptions", "Requests preempted.",
                                          labels=["model"])
        aborts = CounterMetricFamily("encdec_num_aborted_requests", "Requests stopped before they "
                                     "finished (their client left, the server shut down, or another "
                                     "prompt of their request was refused).",
                                     labels=["model"])
        for served in self.models:
            engine = served.engine.engine
            scheduler, blocks = engine.scheduler, engine.block_manager
            name = [served.name]
            gauges["num_requests_running"].add_metric(name, len(scheduler.running))
            gauges["num_requests_waiting"].add_metric(name, served.engine.num_waiting())
            gauges["num_requests_swapped"].add_metric(name, len(scheduler.swapped))
            device_used = blocks.num_total_gpu_blocks - blocks.get_num_free_gpu_blocks()
            cross = blocks.num_cross_gpu_blocks()
            gauges["kv_blocks_in_use"].add_metric([served.name, "self"], max(0, device_used - cross))
            gauges["kv_blocks_in_use"].add_metric([served.name, "cross"], cross)
            gauges["kv_swap_blocks_in_use"].add_metric(
                name, blocks.num_total_cpu_blocks - blocks.get_num_free_cpu_blocks())
            gauges["kv_blocks_capacity"].add_metric(name, blocks.num_total_gpu_blocks)
            stats = engine.stats
            preemptions.add_metric(name, stats.num_preemptions)
            aborts.add_metric(name, stats.num_aborts)
        yield from gauges.values()
        yield preemptions
        yield aborts


class ServerMetrics:
    """The server's own registry (not the process-wide default one), with the process's
    (`process_resident_memory_bytes`, ...), Python's and its garbage collector's metrics."""

    def __init__(self, models: ServedModels, state: ServerState):
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        Gauge("encdec_http_requests_in_flight", "HTTP requests being answered (not /health or "
              "/metrics); a graceful shutdown waits for them.",
              registry=self.registry).set_function(lambda: state.inflight)
        self.requests = Counter("encdec_http_requests", "HTTP requests by endpoint and status.",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("encdec_http_request_duration_seconds",
                                 "Time from request to the end of the response, by endpoint.",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.first_token = Histogram("encdec_time_to_first_token_seconds",
                                     "Time from request to the first generated token: each "
                                     "prompt's; a transcription's once, its first window's.",
                                     ["model"], buckets=FIRST_TOKEN_BUCKETS, registry=self.registry)
        self.queue_time = Histogram("encdec_request_queue_time_seconds", "Time each finished engine "
                                    "request (a transcription's: each window) waited from its arrival "
                                    "to its first step.", ["model"], buckets=LATENCY_BUCKETS,
                                    registry=self.registry)
        self.time_per_output_token = Histogram("encdec_time_per_output_token_seconds", "Each finished "
                                               "engine request's mean time from one generated token "
                                               "to the next (its decode steps).", ["model"],
                                               buckets=OUTPUT_TOKEN_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("encdec_prompt_tokens", "Prompt tokens of the engine's requests: "
                                     "encoder (for Whisper, its audio positions) and decoder.",
                                     ["model"], registry=self.registry)
        self.generation_tokens = Counter("encdec_generation_tokens", "Tokens the engine generated "
                                         "(every sample and temperature fallback).",
                                         ["model"], registry=self.registry)
        self.audio_seconds = Counter("encdec_audio_seconds", "Seconds of audio transcribed.",
                                     ["model"], registry=self.registry)
        self.audio_in_flight = Gauge("encdec_audio_seconds_in_flight", "Seconds of audio the uploads "
                                     "being transcribed hold (--max-audio-seconds-in-flight bounds it).",
                                     registry=self.registry)
        for served in models:  # each model's series from 0, before its first request
            for metric in (self.first_token, self.queue_time, self.time_per_output_token, self.prompt_tokens,
                           self.generation_tokens):
                metric.labels(served.name)
            if served.is_whisper:
                self.audio_seconds.labels(served.name)
        self.registry.register(EngineCollector(models))

    def observe_first_token(self, model: str, output: RequestOutput, start: float) -> None:
        """The time from `start` (`time.monotonic()`) to the first token of `output`'s request."""
        first = output.metrics.first_token_time if output.metrics is not None else None
        self.first_token.labels(model).observe((first or time.monotonic()) - start)

    def observe_finished(self, model: str, output: RequestOutput, steps: int) -> None:
        """The queue time of finished `output`'s request, and its time per output token over its
        `steps` (its longest sequence's tokens), when it had more than one."""
        times = output.metrics
        if times is None or times.time_in_queue is None:
            return
        self.queue_time.labels(model).observe(times.time_in_queue)
        if steps > 1 and times.first_token_time is not None and times.last_token_time is not None:
            self.time_per_output_token.labels(model).observe(
                (times.last_token_time - times.first_token_time) / (steps - 1))

    def count_prompt(self, model: str, output: RequestOutput) -> int:
        """Count the encoder and decoder prompt tokens of `output`'s request; returns them."""
        prompt = len(output.encoder_prompt_token_ids) + len(output.prompt_token_ids)
        self.prompt_tokens.labels(model).inc(prompt)
        return prompt

    def count_generated(self, model: str, outputs: list[CompletionOutput]) -> int:
        """Count the tokens of `outputs`; returns them."""
        generated = sum(len(c.token_ids) for c in outputs)
        self.generation_tokens.labels(model).inc(generated)
        return generated

    def render(self) -> bytes:
        return generate_latest(self.registry)


def log_stats_interval(disabled: bool) -> Optional[float]:
    """The seconds between stats lines (None if `disabled`): $ENCDEC_LOG_STATS_INTERVAL, as
    vLLM's VLLM_LOG_STATS_INTERVAL, else 10. ValueError if it is not a number above 0."""
    if disabled:
        return None
    value = os.environ.get("ENCDEC_LOG_STATS_INTERVAL")
    if value is None:
        return STATS_INTERVAL_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"ENCDEC_LOG_STATS_INTERVAL must be a number of seconds above 0, got {value!r}")
    return seconds


class LoggingStatLogger:
    """vLLM's stats line, read from `metrics`: every `interval` seconds, for each model that had
    work since the last line, its prompt and generation throughput, its running, swapped and
    waiting requests, and the share of its device KV blocks in use."""

    def __init__(self, metrics: ServerMetrics, models: ServedModels, interval: float = STATS_INTERVAL_SECONDS):
        self.metrics, self.names, self.interval = metrics, [served.name for served in models], interval

    def snapshot(self) -> Tally[tuple[str, str]]:
        """Each sample with a model label, by (sample name, model), added up over its other
        labels (KV blocks in use: self- and cross-attention's)."""
        values: Tally[tuple[str, str]] = Tally()
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if "model" in sample.labels:
                    values[sample.name, sample.labels["model"]] += sample.value
        return values

    async def run(self) -> None:
        before, since = self.snapshot(), time.monotonic()
        while True:
            await asyncio.sleep(self.interval)
            after, now = self.snapshot(), time.monotonic()
            for name in self.names:
                self.log(name, before, after, now - since)
            before, since = after, now

    @staticmethod
    def log(model: str, before: Tally[tuple[str, str]], after: Tally[tuple[str, str]], seconds: float) -> None:
        def rate(sample: str) -> float:
            return (after[sample, model] - before[sample, model]) / seconds

        prompt, generation = rate("encdec_prompt_tokens_total"), rate("encdec_generation_tokens_total")
        running, swapped, waiting = (int(after[f"encdec_num_requests_{kind}", model])
                                     for kind in ("running", "swapped", "waiting"))
        if not (prompt or generation or running or swapped or waiting):
            return
        capacity = after["encdec_kv_blocks_capacity", model]
        usage = 100 * after["encdec_kv_blocks_in_use", model] / capacity if capacity else 0.0
        logger.info("%s: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                    "Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, KV cache usage: %.1f%%",
                    model, prompt, generation, running, swapped, waiting, usage)
