"""LLMEngine: requests in, one scheduled forward pass per `step()`, RequestOutputs out."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from encdec.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig
from encdec.core.scheduler import Scheduler
from encdec.inputs.preprocess import InputPreprocessor
from encdec.outputs import CompletionOutput, RequestOutput
from encdec.sampling.params import SamplingParams
from encdec.sampling.sampler import SamplerOutput
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus
from encdec.weights.loader import LoadedModel
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


class LLMEngine:
    def __init__(self, loaded: LoadedModel, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, device_config: DeviceConfig, seed: int = 0):
        self.model_config: ModelConfig = loaded.model_config
        self.tokenizer = loaded.tokenizer
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = device_config.device
        self.input_preprocessor = InputPreprocessor(
            self.model_config, self.tokenizer, loaded.default_decoder_prompt, loaded.audio_processor)
        num_gpu_blocks, num_cpu_blocks = num_blocks(cache_config, self.model_config)
        self.cache_engine = CacheEngine(cache_config, self.model_config, self.device,
                                        num_gpu_blocks, num_cpu_blocks)
        self.scheduler = Scheduler(scheduler_config, cache_config, num_gpu_blocks, num_cpu_blocks)
        self.model_runner = EncoderDecoderModelRunner(
            loaded.model, cache_config.block_size, self.device,
            scheduler_config.max_num_batched_tokens, self.model_config.eos_token_id,
            self.model_config.vocab_size)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._seq_ids = itertools.count()
        self._groups: dict[str, SequenceGroup] = {}
        self.num_steps = 0

    @property
    def block_manager(self):
        return self.scheduler.block_manager

    @property
    def stats(self) -> EngineStats:
        s = self.scheduler.stats
        return EngineStats(self.num_steps, self.model_runner.num_encoder_runs, s.num_preemptions,
                           s.num_recomputes, s.num_swap_outs, s.num_swap_ins)

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                    arrival_time: Optional[float] = None) -> None:
        """Validate and queue one request; raises ValueError and leaves nothing behind."""
        if request_id in self._groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        inputs = self.input_preprocessor.preprocess(prompt)
        self._check_fits(inputs.prompt_token_ids, inputs.encoder_prompt_token_ids, params)
        block_size = self.cache_config.block_size
        eos = self.model_config.eos_token_id
        seq = Sequence.from_inputs(next(self._seq_ids), inputs, block_size, True, eos)
        encoder_seq = Sequence.from_inputs(next(self._seq_ids), inputs, block_size, False)
        group = SequenceGroup(request_id, [seq], params, arrival_time or time.monotonic(),
                              encoder_seq, inputs.encoder_features)
        group.generator = (torch.Generator(device=self.device).manual_seed(params.seed)
                           if params.seed is not None else self.generator)
        self._groups[request_id] = group
        self.scheduler.add_seq_group(group)

    def _check_fits(self, decoder_ids: list[int], encoder_ids: list[int], params: SamplingParams) -> None:
        if params.n > 1 and params.is_greedy:
            raise ValueError(f"n={params.n} needs random sampling: set temperature > 0 "
                             "(greedy decoding would return n identical outputs)")
        block_size = self.cache_config.block_size
        max_len = self.model_config.max_decoder_len
        if params.max_tokens is not None:
            max_len = min(max_len, len(decoder_ids) + params.max_tokens)
        needed = -(-len(encoder_ids) // block_size) + params.n * -(-max_len // block_size)
        total = self.block_manager.num_total_gpu_blocks
        if needed > total:
            raise ValueError(f"the request needs {needed} KV cache blocks (encoder "
                             f"{len(encoder_ids)} tokens, decoder up to {max_len} tokens, n={params.n}) "
                             f"but the cache has only num_gpu_blocks={total}")

    def abort_request(self, request_id: str) -> None:
        if self.scheduler.abort_seq_group(request_id):
            self._groups.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    # -- the step loop -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, move cache blocks, run the model once, and process the samples.

        Returns an output for every request that finished in this step.
        """
        metadata, sched = self.scheduler.schedule()
        if sched.blocks_to_swap_out:
            self.cache_engine.swap_out(sched.blocks_to_swap_out)
        if sched.blocks_to_swap_in:
            self.cache_engine.swap_in(sched.blocks_to_swap_in)
        if sched.blocks_to_copy:
            self.cache_engine.copy(sched.blocks_to_copy)
        if metadata:
            self.num_steps += 1
            sampler_output = self.model_runner.execute_model(metadata, self.cache_engine.gpu_cache)
            self._process_model_outputs(sched.scheduled_seq_groups, sampler_output)
        finished = self.scheduler.free_finished_seq_groups() + sched.ignored_seq_groups
        return [self._request_output(self._groups.pop(g.request_id)) for g in finished]

    def _process_model_outputs(self, groups: list[SequenceGroup], outputs: SamplerOutput) -> None:
        by_id = {o.request_id: o for o in outputs}
        for group in groups:
            samples = by_id[group.request_id].samples
            seqs = group.seqs
            parent_samples = [(seqs[s.parent_seq_id], s) for s in samples]
            if len(samples) > len(group.get_seqs(SequenceStatus.RUNNING)):
                parent_samples = self._fork_children(group, parent_samples)
            for seq, sample in parent_samples:
                seq.append_token_id(sample.token_id, sample.logprob, sample.top_logprobs)
                seq.data.num_computed_tokens = len(seq.data) - 1
                self._check_stop(seq, group.sampling_params)
                if seq.is_finished():
                    self.scheduler.free_seq(seq)

    def _fork_children(self, group: SequenceGroup, parent_samples):
        """First step of an n > 1 request: the parent's extra samples become forked children."""
        forked, used = [], set()
        for parent, sample in parent_samples:
            if parent.seq_id in used:
                child = parent.fork(next(self._seq_ids))
                group.add(child)
                self.block_manager.fork(parent, child)
                forked.append((child, sample))
            else:
                used.add(parent.seq_id)
                forked.append((parent, sample))
        return forked

    def _check_stop(self, seq: Sequence, params: SamplingParams) -> None:
        token = seq.data.get_last_token_id()
        num_out = len(seq.data.output_token_ids)
        if num_out >= params.min_tokens and (
                token in params.stop_token_ids
                or (not params.ignore_eos and token == self.model_config.eos_token_id)):
            seq.status = SequenceStatus.FINISHED_STOPPED
        elif (params.max_tokens is not None and num_out >= params.max_tokens) or \
                len(seq) >= self.model_config.max_decoder_len:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED

    def _request_output(self, group: SequenceGroup) -> RequestOutput:
        params = group.sampling_params
        outputs = []
        for index, seq in enumerate(group.get_seqs()):
            ids = seq.data.output_token_ids
            text = (self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
                    if self.tokenizer is not None else "")
            outputs.append(CompletionOutput(index, text, list(ids), seq.data.cumulative_logprob,
                                            seq.output_logprobs if params.logprobs is not None else None,
                                            seq.status.finish_reason))
        first = next(iter(group.seqs.values()))
        return RequestOutput(group.request_id, first.prompt, list(first.data.prompt_token_ids),
                             group.encoder_seq.prompt, list(group.encoder_seq.data.prompt_token_ids),
                             outputs, group.is_finished())
