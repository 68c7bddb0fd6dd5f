"""LLMEngine: requests in, one scheduled forward pass per `step()`, RequestOutputs out.

`step()` returns an output for every request that advanced (as its `output_kind` asks: see
`encdec.engine.output_processor`). Sequences change only through their own methods, forks
through the scheduler's block manager; each request's generators (one a sample) and
beam-search state live in its `SequenceGroup`.
"""
from __future__ import annotations

import dataclasses
import itertools
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch

from encdec.checks import number
from encdec.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, auto_running_requests,
                           resolve_dtype)
from encdec.core.scheduler import Scheduler
from encdec.generation_config import GenerationDefaults, load_generation_defaults, resolve_sampling_params
from encdec.inputs.data import is_explicit_encoder_decoder_prompt
from encdec.inputs.preprocess import InputPreprocessor
from encdec.inputs.tokenizing import TokenizerGroup
from encdec.models.quantization import resolve_compute_type
from encdec.engine.output_processor import OutputProcessor
from encdec.outputs import RequestOutput
from encdec.sampling.beam_search import BeamSearch
from encdec.sampling.logits_processors import bad_words_token_ids
from encdec.sampling.params import SamplingParams
from encdec.sampling.sampler import SamplerOutput, SequenceOutput
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus
from encdec.weights.loader import LoadedModel, load_model
from encdec.worker.cpu_memory import keep_freed_memory, trim_heap
from encdec.worker.cache_engine import CacheEngine, num_blocks
from encdec.worker.model_runner import EncoderDecoderModelRunner


@dataclass
class EngineStats:
    """Counters a test or a benchmark can read."""

    num_steps: int
    num_encoder_runs: int
    num_preemptions: int
    num_recomputes: int
    num_swap_outs: int
    num_swap_ins: int
    num_aborts: int


class LLMEngine:
    """`generation_defaults` (the checkpoint's generation config) fill each request's unset
    sampling params."""

    def __init__(self, loaded: LoadedModel, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, device_config: DeviceConfig, seed: int = 0,
                 generation_defaults: Optional[GenerationDefaults] = None, tune_malloc: bool = False):
        self.model_config: ModelConfig = loaded.model_config
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.tokenizer = loaded.tokenizer
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = device_config.device
        if self.device.type == "cpu" and tune_malloc:
            keep_freed_memory()
        self.input_preprocessor = InputPreprocessor(
            self.model_config, self.tokenizer, loaded.default_decoder_prompt, loaded.audio_processor)
        num_gpu_blocks, num_cpu_blocks = num_blocks(cache_config, self.model_config, self.device)
        self.cache_engine = CacheEngine(cache_config, self.model_config, self.device,
                                        num_gpu_blocks, num_cpu_blocks)
        self.scheduler = Scheduler(scheduler_config, cache_config, num_gpu_blocks, num_cpu_blocks)
        if loaded.audio_processor is not None:
            self._check_a_window_fits()
        self.model_runner = EncoderDecoderModelRunner(
            loaded.model, cache_config.block_size, self.device,
            scheduler_config.max_num_batched_tokens, self.model_config.eos_token_id,
            self.model_config.vocab_size)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.output_processor = OutputProcessor(self.tokenizer, self.model_config.eos_token_id,
                                                self.scheduler.free_seq)
        self.seq_ids = itertools.count()
        self.groups: dict[str, SequenceGroup] = {}
        self.failures: dict[str, Exception] = {}  # see `take_failures`
        self.num_steps = 0

    @classmethod
    def from_model(cls, model: str, dtype: str = "auto", device: Optional[str] = None,
                   block_size: int = 16, num_gpu_blocks: Optional[int] = None,
                   kv_cache_space: float = 2.0, swap_space: float = 1.0, max_num_seqs: int = 256,
                   max_num_batched_tokens: int = 16384, preemption_mode: Optional[str] = None,
                   seed: Optional[int] = 0, attention_backend: Optional[str] = None,
                   tune_malloc: bool = False, quantization: Optional[str] = None,
                   compute_type: Optional[str] = None,
                   max_running_requests: Union[int, str, None] = None,
                   max_model_len: Optional[int] = None) -> "LLMEngine":
        """Load `model` (a local checkpoint directory or a Whisper alias) and size the engine;
        the options are `LLM`'s."""
        seed = secrets.randbits(63) if seed is None else number("seed", seed, 0, 2**63 - 1, integer=True)
        dtype, quantization = resolve_compute_type(compute_type, dtype, quantization)
        device_config = DeviceConfig.create(device)
        if resolve_dtype(dtype) == torch.float16 and device_config.device.type == "cpu":
            warnings.warn("dtype float16 on the CPU runs without fast kernels (several times slower "
                          "than float32); dtype='bfloat16' is the CPU's fast half precision",
                          stacklevel=3)
        cache_config = CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                   kv_cache_space=kv_cache_space, swap_space=swap_space)
        auto = isinstance(max_running_requests, str) and max_running_requests == "auto"
        scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                           max_num_batched_tokens=max_num_batched_tokens,
                                           preemption_mode=preemption_mode,
                                           max_running_requests=None if auto else max_running_requests)
        loaded = load_model(model, resolve_dtype(dtype), device_config.device, attention_backend,
                            quantization)
        trim_heap()  # weights that loading converted (float32 ones a lower precision replaced) are free
        speech = loaded.audio_processor is not None
        loaded.model_config = loaded.model_config.with_max_model_len(max_model_len, speech)
        if max_model_len is not None and max_model_len < len(loaded.default_decoder_prompt):
            raise ValueError(f"max_model_len={max_model_len}: the model's decoder prompt "
                             f"{loaded.default_decoder_prompt} takes {len(loaded.default_decoder_prompt)} "
                             f"positions, so at least {len(loaded.default_decoder_prompt)}")
        if auto:
            scheduler_config = dataclasses.replace(scheduler_config, max_running_requests=auto_running_requests(
                speech, device_config.device))
        needed = loaded.model_config.max_encoder_len + loaded.model_config.max_decoder_len
        if max_num_batched_tokens < needed:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} is smaller than one "
                             f"request can need ({needed}: encoder + decoder positions)")
        defaults = load_generation_defaults(model)
        eos = loaded.model_config.eos_token_id
        defaults = dataclasses.replace(defaults, eos_token_ids=tuple(t for t in defaults.eos_token_ids if t != eos))
        if speech:
            defaults = defaults.for_speech(loaded.model_config.max_decoder_len)
        return cls(loaded, cache_config, scheduler_config, device_config, seed, defaults,
                   tune_malloc)

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's call; also the `tokenizer` attribute)."""
        return self.tokenizer

    def get_tokenizer_group(self) -> TokenizerGroup:
        """vLLM's tokenizer group (`.encode(prompt=...)`) around the model's tokenizer."""
        return TokenizerGroup(self.tokenizer)

    @property
    def block_manager(self):
        return self.scheduler.block_manager

    @property
    def stats(self) -> EngineStats:
        s = self.scheduler.stats
        return EngineStats(self.num_steps, self.model_runner.num_encoder_runs, s.num_preemptions,
                           s.num_recomputes, s.num_swap_outs, s.num_swap_ins, s.num_aborts)

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                    arrival_time: Optional[float] = None,
                    return_cross_kv: Union[bool, Callable[[RequestOutput], bool]] = False) -> None:
        """Validate and queue one request; raises ValueError and leaves nothing behind.
        `arrival_time` (time.monotonic(); default: now) places it among the waiting requests.
        `return_cross_kv`: its final output carries the cross-attention keys and values
        (`RequestOutput.cross_kv`), read from the cache before its blocks are freed; a callable
        decides on the final output (called in the engine's thread)."""
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a string, got {request_id!r}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"request {request_id!r}: sampling params must be a SamplingParams, "
                             f"got {type(params).__name__}")
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        arrival_time = number("arrival_time", arrival_time, none=True)
        if not (isinstance(return_cross_kv, bool) or callable(return_cross_kv)):
            raise ValueError(f"return_cross_kv must be a bool or a callable, got {return_cross_kv!r}")
        params = dataclasses.replace(params)  # checked again: its fields may have changed since
        inputs = self.input_preprocessor.preprocess(prompt, params.truncate_prompt_tokens)
        if not _has_decoder_prompt(prompt) and len(inputs.prompt_token_ids) > 1 and self._resolve(
                dataclasses.replace(params, max_tokens=None, min_tokens=None),  # lengths: against the final prompt
                inputs.prompt_token_ids).forced_bos_token_id is not None:
            # Hugging Face's default: the prompt is <DEC> alone and BOS its first generated token
            inputs.prompt_token_ids = [self.model_config.decoder_start_token_id]
        params = self._resolve(params, inputs.prompt_token_ids)
        whole = {name: self.model_config.vocab_size for name in ("logprobs", "prompt_logprobs")
                 if getattr(params, name) == -1}
        if whole:  # vLLM's -1: every token of the vocabulary
            params = dataclasses.replace(params, **whole)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop: this model has no tokenizer to find stop strings with "
                             "(use stop_token_ids)")
        if params.bad_words:
            if self.tokenizer is None:
                raise ValueError("bad_words: this model has no tokenizer to tokenize them with (use bad_words_ids)")
            params = dataclasses.replace(params, bad_words_ids=(params.bad_words_ids or [])
                                         + bad_words_token_ids(self.tokenizer, params.bad_words))
        self._check_token_ids(params)
        self._check_fits(inputs.prompt_token_ids, inputs.encoder_prompt_token_ids, params)
        block_size = self.cache_config.block_size
        seq = Sequence.from_inputs(next(self.seq_ids), inputs, block_size, True)
        encoder_seq = Sequence.from_inputs(next(self.seq_ids), inputs, block_size, False)
        # vLLM's seeds: the i-th of n samples draws from seed + i, so each is reproducible alone
        generators = ([torch.Generator(device=self.device).manual_seed((params.seed + i) % 2**64)
                       for i in range(params.n)] if params.seed is not None else [self.generator] * params.n)
        group = SequenceGroup(request_id, [seq], params, time.monotonic() if arrival_time is None else arrival_time,
                              encoder_seq, inputs.encoder_features, generators,
                              BeamSearch(params) if params.use_beam_search else None, return_cross_kv,
                              inputs.cross_kv)
        self.groups[request_id] = group
        self.scheduler.add_seq_group(group)

    def _resolve(self, params: SamplingParams, decoder_ids: list[int]) -> SamplingParams:
        return resolve_sampling_params(params, self.generation_defaults, len(decoder_ids),
                                       self.model_config.max_decoder_len)

    def _check_token_ids(self, params: SamplingParams) -> None:
        """Token ids and counts in the params must fit the vocabulary (a step never fails on
        one request's params)."""
        vocab = self.model_config.vocab_size
        for name in ("forced_bos_token_id", "forced_eos_token_id"):
            token = getattr(params, name)
            if token is not None and token >= vocab:
                raise ValueError(f"{name}={token} is not a token id of this model (vocab_size={vocab})")
        lists = {name: getattr(params, name) or [] for name in
                 ("stop_token_ids", "suppress_tokens", "begin_suppress_tokens", "allowed_token_ids")}
        lists["logit_bias"] = list(params.logit_bias or {})
        lists["bad_words_ids"] = [t for word in params.bad_words_ids or [] for t in word]
        for name, ids in lists.items():
            unknown = next((t for t in ids if t >= vocab), None)
            if unknown is not None:
                raise ValueError(f"{name}: {unknown} is not a token id of this model (vocab_size={vocab})")
        for name in ("logprobs", "prompt_logprobs"):
            count = getattr(params, name)
            if count is not None and count > vocab:
                raise ValueError(f"{name}={count} is more than the vocabulary (vocab_size={vocab})")

    def _check_a_window_fits(self) -> None:
        """Every Whisper request holds a whole window's encoder positions and decodes up to the
        decoder's positions (a window conditioned on the text before it): a cache that cannot
        hold one such request could not serve every audio, so the engine is refused (as vLLM
        refuses a cache smaller than one sequence of its longest length)."""
        bm, positions = self.block_manager, self.model_config.max_encoder_len
        decoder_len = self.model_config.max_decoder_len
        needed = bm.max_num_blocks(positions, decoder_len, 1)
        if not bm.can_ever_fit(needed):
            raise ValueError(f"num_gpu_blocks={bm.num_total_gpu_blocks}: the KV cache cannot hold one "
                             f"Whisper window, whose {positions} encoder positions and {decoder_len} "
                             f"decoder positions need {needed} blocks of {self.cache_config.block_size} tokens"
                             + (f" (and {bm.watermark_blocks} kept free)" if bm.watermark_blocks else ""))

    def check_num_seqs(self, params: SamplingParams) -> None:
        """Refuse a request that would run more sequences at once than the engine ever does."""
        field = "beam_width" if params.use_beam_search else "n"
        self.scheduler_config.check_num_seqs(params.max_num_seqs, f"{field}={params.max_num_seqs}")

    def check_can_ever_fit(self, encoder_len: int, decoder_len: int, num_seqs: int, field: str) -> None:
        """Refuse (ValueError naming `field`) a request of `num_seqs` sequences over `encoder_len`
        encoder tokens, each caching up to `decoder_len` decoder tokens, that the cache could never
        hold at once."""
        bm = self.block_manager
        needed = bm.max_num_blocks(encoder_len, decoder_len, num_seqs)
        if not bm.can_ever_fit(needed):
            raise ValueError(f"{field}: the request needs {needed} KV cache blocks (encoder "
                             f"{encoder_len} tokens, decoder up to {decoder_len} cached tokens, "
                             f"{num_seqs} sequence{'s' if num_seqs > 1 else ''}) but the cache has only "
                             f"num_gpu_blocks={bm.num_total_gpu_blocks}, less a watermark of "
                             f"{bm.watermark_blocks} kept free")

    def _check_fits(self, decoder_ids: list[int], encoder_ids: list[int], params: SamplingParams) -> None:
        if params.n > 1 and params.is_greedy and not params.use_beam_search:
            raise ValueError(f"n={params.n} needs random sampling: set temperature > 0 "
                             "(greedy decoding would return n identical outputs)")
        self.check_num_seqs(params)
        # the decoder tokens cached: the prompt and every new token but the last, never fed back
        max_len = self.model_config.max_decoder_len
        if params.max_tokens is not None:
            max_len = min(max_len, len(decoder_ids) + params.max_tokens - 1)
        seqs = params.max_num_seqs
        bm = self.block_manager

        def fits(decoder_len: int, num_seqs: int) -> bool:
            return bm.can_ever_fit(bm.max_num_blocks(len(encoder_ids), decoder_len, num_seqs))

        if fits(max_len, seqs):
            return
        # the field to change: a prompt that never fits, else the samples, else the length
        if not fits(1, 1):
            field = "encoder_prompt"
        elif not fits(len(decoder_ids), 1):
            field = "decoder_prompt"
        elif seqs > 1 and fits(max_len, 1):
            field = f"{'beam_width' if params.use_beam_search else 'n'}={seqs}"
        else:
            field = "max_tokens" + ("=" + str(params.max_tokens) if params.max_tokens is not None else " (unset)")
        self.check_can_ever_fit(len(encoder_ids), max_len, seqs, field)

    def abort_request(self, request_id: Union[str, Iterable[str]],
                      final_output: bool = False) -> Optional[RequestOutput]:
        """Stop a request (or each of a list of them, as vLLM takes them) wherever it is and
        free its blocks; unknown ids are ignored. With `final_output` and one id, returns the
        request's last output (its unfinished completions' finish_reason "abort", as vLLM ends
        an aborted request's stream; `n` of them also before the request first ran)."""
        if not isinstance(request_id, str):
            for one in request_id:
                self.abort_request(one)
            return None
        if not self.scheduler.abort_seq_group(request_id):
            return None
        group = self.groups.pop(request_id, None)
        output = None
        if final_output and group is not None:
            seqs = group.get_seqs()
            for index in range(len(seqs), group.sampling_params.n):  # aborted before its first step forked it
                group.add(seqs[0].fork(next(self.seq_ids), index))
            output = self.output_processor.make_output(group)
        self.output_processor.abort(request_id)
        return output

    def abort_all(self) -> None:
        """Drop every request and free every block at once (not request by request: a step
        that failed midway may have left their tables half freed)."""
        scheduler = self.scheduler
        for queue in (scheduler.waiting, scheduler.running, scheduler.swapped):
            queue.clear()
        for request_id in self.groups:
            self.output_processor.abort(request_id)
        self.groups.clear()
        scheduler.block_manager.reset()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    # -- the step loop -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, move cache blocks, run the model once, and process the samples.

        Returns an output for every request that advanced in this step and has one to give
        (see `OutputProcessor`); the last one of a request has `finished` set.
        """
        metadata, sched = self.scheduler.schedule()
        now = time.monotonic()
        for group in sched.scheduled_seq_groups:
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
                group.metrics.time_in_queue = now - group.arrival_time
        if sched.blocks_to_swap_out:
            self.cache_engine.swap_out(sched.blocks_to_swap_out)
        if sched.blocks_to_swap_in:
            self.cache_engine.swap_in(sched.blocks_to_swap_in)
        if sched.blocks_to_copy:
            self.cache_engine.copy(sched.blocks_to_copy)
        failed: dict[str, Exception] = {}
        if metadata:
            self.num_steps += 1
            sampler_output = self.model_runner.execute_model(metadata, self.cache_engine.gpu_cache)
            failed = self.process_model_outputs(sched.scheduled_seq_groups, sampler_output)
            for request_id in failed:
                self.abort_request(request_id)
            self.failures.update(failed)
        scheduled = [g for g in sched.scheduled_seq_groups if g.request_id not in failed]
        outputs = [self.output_processor.make_output(g) for g in scheduled + sched.ignored_seq_groups]
        for i, (group, out) in enumerate(zip(scheduled, outputs)):
            wanted = group.return_cross_kv
            if out is None or not out.finished or not wanted:
                continue
            try:
                wanted = wanted is True or wanted(out)
            except Exception as err:  # the caller's own callable: its request fails alone
                self.failures[group.request_id] = err
                outputs[i] = None
                continue
            if wanted:
                out.cross_kv = self.cache_engine.gather(
                    self.block_manager.get_cross_block_table(group), len(group.encoder_seq))
        for group in self.scheduler.free_finished_seq_groups() + sched.ignored_seq_groups:
            self.groups.pop(group.request_id)
        return [out for out in outputs if out is not None]

    def take_failures(self) -> dict[str, Exception]:
        """The requests that failed alone in the steps since the last call, with their errors
        (a logits processor of theirs failed): they are aborted and give no more outputs."""
        failures, self.failures = self.failures, {}
        return failures

    def process_model_outputs(self, groups: list[SequenceGroup], outputs: SamplerOutput) -> dict[str, Exception]:
        """Append the samples to their sequences; returns the groups that failed, with the error."""
        by_id = {o.request_id: o for o in outputs}
        now = time.monotonic()
        failed = {}
        for group in groups:
            output = by_id[group.request_id]
            if output.error is not None:
                failed[group.request_id] = output.error
                continue
            if output.prompt_logprobs is not None:
                group.prompt_logprobs = self.output_processor.name_tokens(
                    output.prompt_logprobs, group.sampling_params)
            samples = output.samples
            if samples:
                group.metrics.last_token_time = now
                if group.metrics.first_token_time is None:
                    group.metrics.first_token_time = now
            if group.beam_search is not None:
                self._process_beams(group, samples)
                continue
            seqs = group.seqs
            parent_samples = [(seqs[s.parent_seq_id], s) for s in samples]
            if len(samples) > len(group.get_seqs(SequenceStatus.RUNNING)):  # the first step's n samples
                parent_samples = self._fork_children(group, parent_samples)
            for seq, sample in parent_samples:
                if sample.top_logprobs is not None:
                    self.output_processor.name_tokens([sample.top_logprobs], group.sampling_params)
                seq.append_token_id(sample.token_id, sample.logprob, sample.top_logprobs)
                status = self._stop_status(seq, group.sampling_params)
                if status is not None:
                    seq.finish(status)
                    self.scheduler.free_seq(seq)
        return failed

    def _process_beams(self, group: SequenceGroup, samples: list[SequenceOutput]) -> None:
        """One beam-search step: continue, fork and free beams; the group keeps them in rank order.

        Beams that do not continue free their blocks and leave the group, unless the search is
        done: then they stay, finished, so the group is finished too.
        """
        search = group.beam_search
        params = group.sampling_params
        parents = {seq.seq_id: seq for seq in group.get_seqs(SequenceStatus.RUNNING)}
        outputs = {i: seq.data.output_token_ids for i, seq in parents.items()}

        def is_stop(candidate: SequenceOutput) -> bool:
            return (params.is_stop_token(candidate.token_id, self.model_config.eos_token_id)
                    or self.output_processor.ends_in_stop_string(
                        outputs[candidate.parent_seq_id], candidate.token_id, params))

        beams = search.step(samples, outputs, is_stop)
        children = self._fork_children(group, [(parents[c.parent_seq_id], c) for c in beams])
        continuing = {seq.seq_id for seq, _ in children}
        for seq in parents.values():
            if seq.seq_id not in continuing:
                self.scheduler.free_seq(seq)
                seq.finish(SequenceStatus.FINISHED_STOPPED)
                if not search.done:
                    group.remove(seq.seq_id)
        for seq, sample in children:
            seq.append_token_id(sample.token_id, sample.logprob, score=sample.beam_score)
            group.move_to_end(seq.seq_id)

    def _fork_children(self, group: SequenceGroup, parent_samples):
        """Samples past the first of a parent (n > 1, beam search) become its forked children;
        the i-th sample's child is sample i of the request (its generator, when seeded)."""
        forked, used = [], set()
        for index, (parent, sample) in enumerate(parent_samples):
            if parent.seq_id in used:
                forked.append((self.scheduler.fork_seq(group, parent, next(self.seq_ids), index), sample))
            else:
                used.add(parent.seq_id)
                forked.append((parent, sample))
        return forked

    def _stop_status(self, seq: Sequence, params: SamplingParams) -> Optional[SequenceStatus]:
        """How the sequence finishes after its last token, or None if it goes on."""
        token = seq.data.get_last_token_id()
        num_out = len(seq.data.output_token_ids)
        if (num_out >= params.min_tokens and params.is_stop_token(token, self.model_config.eos_token_id)
                and not params.is_forced_end(num_out, token)):
            return SequenceStatus.FINISHED_STOPPED
        if (params.max_tokens is not None and num_out >= params.max_tokens) or \
                len(seq) > self.model_config.max_decoder_len:
            return SequenceStatus.FINISHED_LENGTH_CAPPED
        return None


def _has_decoder_prompt(prompt: Any) -> bool:
    return is_explicit_encoder_decoder_prompt(prompt) and prompt.get("decoder_prompt") is not None
