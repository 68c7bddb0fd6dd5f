"""LLMEngine: requests in, one scheduled forward pass per `step()`, RequestOutputs out."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from encdec.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig
from encdec.core.scheduler import Scheduler
from encdec.generation_config import GenerationDefaults, resolve_sampling_params
from encdec.inputs.data import is_explicit_encoder_decoder_prompt
from encdec.inputs.preprocess import InputPreprocessor
from encdec.outputs import CompletionOutput, RequestOutput
from encdec.sampling.beam_search import BeamSearch
from encdec.sampling.params import SamplingParams
from encdec.sampling.sampler import SamplerOutput, SequenceOutput
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus
from encdec.weights.loader import LoadedModel
from encdec.worker.cpu_memory import keep_freed_memory
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
    """`generation_defaults` (the checkpoint's generation config) fill each request's unset
    sampling params; beam requests keep their search state here, outside the sequences."""

    def __init__(self, loaded: LoadedModel, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, device_config: DeviceConfig, seed: int = 0,
                 generation_defaults: Optional[GenerationDefaults] = None):
        self.model_config: ModelConfig = loaded.model_config
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.tokenizer = loaded.tokenizer
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.device = device_config.device
        if self.device.type == "cpu":
            keep_freed_memory()
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
        self._beams: dict[str, BeamSearch] = {}
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
        resolved = self._resolve(params, inputs.prompt_token_ids)
        if resolved.forced_bos_token_id is not None and not _has_decoder_prompt(prompt):
            # Hugging Face's default: the prompt is <DEC> alone and BOS its first generated token
            inputs.prompt_token_ids = [self.model_config.decoder_start_token_id]
            resolved = self._resolve(params, inputs.prompt_token_ids)
        params = resolved
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
        if params.use_beam_search:
            self._beams[request_id] = BeamSearch(params)
        self.scheduler.add_seq_group(group)

    def _resolve(self, params: SamplingParams, decoder_ids: list[int]) -> SamplingParams:
        return resolve_sampling_params(params, self.generation_defaults, len(decoder_ids),
                                       self.model_config.max_decoder_len)

    def _check_fits(self, decoder_ids: list[int], encoder_ids: list[int], params: SamplingParams) -> None:
        if params.n > 1 and params.is_greedy and not params.use_beam_search:
            raise ValueError(f"n={params.n} needs random sampling: set temperature > 0 "
                             "(greedy decoding would return n identical outputs)")
        block_size = self.cache_config.block_size
        max_len = self.model_config.max_decoder_len
        if params.max_tokens is not None:
            max_len = min(max_len, len(decoder_ids) + params.max_tokens)
        seqs = params.max_num_seqs
        needed = -(-len(encoder_ids) // block_size) + seqs * -(-max_len // block_size)
        total = self.block_manager.num_total_gpu_blocks
        if needed > total:
            raise ValueError(f"the request needs {needed} KV cache blocks (encoder "
                             f"{len(encoder_ids)} tokens, decoder up to {max_len} tokens, "
                             f"{seqs} sequences) but the cache has only num_gpu_blocks={total}")

    def abort_request(self, request_id: str) -> None:
        if self.scheduler.abort_seq_group(request_id):
            self._groups.pop(request_id, None)
            self._beams.pop(request_id, None)

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
            if group.sampling_params.use_beam_search:
                self._process_beams(group, samples)
                continue
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

    def _process_beams(self, group: SequenceGroup, samples: list[SequenceOutput]) -> None:
        """One beam-search step: continue, fork and free beams; the group keeps them in rank order.

        Beams that do not continue free their blocks and leave the group, unless the search is
        done: then they stay, finished, so the group is finished too.
        """
        search = self._beams[group.request_id]
        params = group.sampling_params
        parents = {seq.seq_id: seq for seq in group.get_seqs(SequenceStatus.RUNNING)}
        beams = search.step(samples, {i: seq.data.output_token_ids for i, seq in parents.items()},
                            lambda token: self._is_stop_token(token, params))
        children = self._fork_children(group, [(parents[c.parent_seq_id], c) for c in beams])
        continuing = {seq.seq_id for seq, _ in children}
        for seq in parents.values():
            if seq.seq_id not in continuing:
                self.scheduler.free_seq(seq)
                seq.status = SequenceStatus.FINISHED_STOPPED
                if not search.done:
                    group.remove(seq.seq_id)
        for seq, sample in children:
            seq.append_token_id(sample.token_id, sample.logprob)
            seq.data.cumulative_logprob = sample.beam_score  # exactly the float32 running score
            seq.data.num_computed_tokens = len(seq.data) - 1
            group.remove(seq.seq_id)
            group.add(seq)

    def _fork_children(self, group: SequenceGroup, parent_samples):
        """Samples past the first of a parent (n > 1, beam search) become its forked children."""
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

    def _is_stop_token(self, token: int, params: SamplingParams) -> bool:
        return token in params.stop_token_ids or (
            not params.ignore_eos and token == self.model_config.eos_token_id)

    def _check_stop(self, seq: Sequence, params: SamplingParams) -> None:
        token = seq.data.get_last_token_id()
        num_out = len(seq.data.output_token_ids)
        if num_out >= params.min_tokens and self._is_stop_token(token, params):
            seq.status = SequenceStatus.FINISHED_STOPPED
        elif (params.max_tokens is not None and num_out >= params.max_tokens) or \
                len(seq) >= self.model_config.max_decoder_len:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED

    def _request_output(self, group: SequenceGroup) -> RequestOutput:
        """The group's sequences, or for beam search its best n hypotheses by score."""
        params = group.sampling_params
        search = self._beams.pop(group.request_id, None)
        if search is not None and search.finished:
            results = [(h.token_ids, h.cumulative_logprob, None, h.finish_reason)
                       for h in search.best(params.n)]
        else:
            results = [(seq.data.output_token_ids, seq.data.cumulative_logprob,
                        seq.output_logprobs if params.logprobs is not None else None,
                        seq.status.finish_reason) for seq in group.get_seqs()]
        outputs = []
        for index, (ids, cumulative_logprob, logprobs, finish_reason) in enumerate(results):
            text = (self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
                    if self.tokenizer is not None else "")
            outputs.append(CompletionOutput(index, text, list(ids), cumulative_logprob, logprobs,
                                            finish_reason))
        first = next(iter(group.seqs.values()))
        return RequestOutput(group.request_id, first.prompt, list(first.data.prompt_token_ids),
                             group.encoder_seq.prompt, list(group.encoder_seq.data.prompt_token_ids),
                             outputs, group.is_finished())


def _has_decoder_prompt(prompt: Any) -> bool:
    return is_explicit_encoder_decoder_prompt(prompt) and prompt.get("decoder_prompt") is not None
