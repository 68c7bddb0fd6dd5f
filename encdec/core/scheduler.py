"""Continuous batching: which groups run this step, and what moves in the cache first.

Each step: running groups get a slot for their next token, preempting the most recently
admitted groups when blocks run out (by recompute for single-sequence groups, by swap
otherwise when the swap pool has room, or as `preemption_mode` says); when nothing was
preempted, swapped groups come back and waiting groups are admitted in arrival order within
the budgets (and while fewer than `max_running_requests` run). Prefills and decodes share one
step.
Preemption by recompute frees both the self and the cross blocks, so the encoder runs again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from encdec.config import CacheConfig, SchedulerConfig
from encdec.core.block_manager import AllocStatus, BlockSpaceManager
from encdec.sequence import Sequence, SequenceGroup, SequenceGroupMetadata, SequenceStatus


@dataclass
class SchedulerOutputs:
    scheduled_seq_groups: list[SequenceGroup]
    num_prefill_groups: int
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    ignored_seq_groups: list[SequenceGroup] = field(default_factory=list)


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    num_recomputes: int = 0
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    num_aborts: int = 0


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_gpu_blocks: int, num_cpu_blocks: int):
        self.config = scheduler_config
        self.block_manager = BlockSpaceManager(cache_config.block_size, num_gpu_blocks,
                                               num_cpu_blocks, cache_config.watermark)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self.stats = SchedulerStats()
        # whether the last step left groups waiting or swapped for want of device blocks
        self.out_of_blocks = False

    # -- queue management ---------------------------------------------------------------
    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue a request in arrival order: one that carries an earlier arrival (a Whisper
        window's fallback or next window carries its upload's) goes ahead of later ones."""
        at = len(self.waiting)
        while at and self.waiting[at - 1].arrival_time > seq_group.arrival_time:
            at -= 1
        self.waiting.insert(at, seq_group)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def abort_seq_group(self, request_id: str) -> bool:
        """Abort a request wherever it is; frees its self and cross blocks."""
        for queue in (self.waiting, self.running, self.swapped):
            for group in queue:
                if group.request_id == request_id:
                    queue.remove(group)
                    for seq in group.get_unfinished_seqs():
                        seq.status = SequenceStatus.FINISHED_ABORTED
                    self._free_group(group)
                    self.stats.num_aborts += 1
                    return True
        return False

    def free_seq(self, seq: Sequence) -> None:
        self.block_manager.free(seq)

    def fork_seq(self, group: SequenceGroup, parent: Sequence, child_seq_id: int, sample_index: int) -> Sequence:
        """A copy of `parent` that joins its group as its `sample_index`-th sample, sharing its
        blocks (n > 1, beam search)."""
        child = parent.fork(child_seq_id, sample_index)
        group.add(child)
        self.block_manager.fork(parent, child)
        return child

    def free_finished_seq_groups(self) -> list[SequenceGroup]:
        finished = [g for g in self.running if g.is_finished()]
        for group in finished:
            self.running.remove(group)
            self._free_group(group)
        return finished

    def _free_group(self, group: SequenceGroup) -> None:
        for seq in group.get_seqs():
            self.block_manager.free(seq)
        self.block_manager.free_cross(group)

    # -- scheduling ---------------------------------------------------------------------
    def schedule(self) -> tuple[list[SequenceGroupMetadata], SchedulerOutputs]:
        out = SchedulerOutputs([], 0)
        decodes, preempted = self._schedule_running(out)
        budget_seqs = self.config.max_num_seqs - sum(g.num_seqs(SequenceStatus.RUNNING) for g in decodes)
        budget_tokens = self.config.max_num_batched_tokens - sum(
            g.num_seqs(SequenceStatus.RUNNING) for g in decodes)
        if not preempted:
            budget_seqs, budget_tokens = self._schedule_swapped(out, decodes, budget_seqs, budget_tokens)
        prefills = []
        self.out_of_blocks = preempted or bool(self.swapped)
        if not self.out_of_blocks:
            prefills = self._schedule_prefills(out, budget_seqs, budget_tokens)
        out.scheduled_seq_groups = prefills + decodes
        out.num_prefill_groups = len(prefills)
        return [self._metadata(g, is_prompt=i < len(prefills))
                for i, g in enumerate(out.scheduled_seq_groups)], out

    def _schedule_running(self, out: SchedulerOutputs) -> tuple[list[SequenceGroup], bool]:
        """Give each running group its next slots, preempting from the back of the queue.

        If a preemption fails, every group is still in a queue and owns its blocks, but the
        block moves of this step are lost: the caller must abort the unfinished requests.
        """
        scheduled: list[SequenceGroup] = []
        preempted = False
        running = self.running
        self.running = deque()
        try:
            while running:
                group = running[0]
                while not self.block_manager.can_append_slots(group):
                    preempted = True
                    victim = running[-1]
                    self._preempt(victim, out)
                    running.pop()
                    if victim is group:
                        break
                else:
                    for seq in group.get_seqs(SequenceStatus.RUNNING):
                        out.blocks_to_copy.extend(self.block_manager.append_slots(seq))
                    scheduled.append(running.popleft())
        finally:
            self.running.extend(scheduled)
            self.running.extend(running)
        return scheduled, preempted

    def _schedule_swapped(self, out: SchedulerOutputs, decodes: list[SequenceGroup],
                          budget_seqs: int, budget_tokens: int) -> tuple[int, int]:
        while self.swapped:
            group = self.swapped[0]
            num_seqs = group.num_seqs(SequenceStatus.SWAPPED)
            # alone in its step it may pass the token budget, as a first prefill may
            if num_seqs > budget_seqs or (num_seqs > budget_tokens and decodes):
                break
            status = self.block_manager.can_swap_in(group)
            if status == AllocStatus.NEVER:
                raise RuntimeError(f"request {group.request_id} was swapped out but can never fit "
                                   "in the device cache again; raise num_gpu_blocks")
            if status == AllocStatus.LATER:
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.extend(self.block_manager.swap_in(group))
            self.stats.num_swap_ins += 1
            for seq in group.get_seqs(SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
                out.blocks_to_copy.extend(self.block_manager.append_slots(seq))
            decodes.append(group)
            self.running.append(group)
            budget_seqs -= num_seqs
            budget_tokens -= num_seqs
        return budget_seqs, budget_tokens

    def _schedule_prefills(self, out: SchedulerOutputs, budget_seqs: int,
                           budget_tokens: int) -> list[SequenceGroup]:
        scheduled = []
        cap = self.config.max_running_requests
        while self.waiting and (cap is None or len(self.running) < cap):
            group = self.waiting[0]
            seqs = group.get_seqs(SequenceStatus.WAITING)  # several after a recompute (n > 1, beams)
            num_tokens = sum(len(seq) + len(group.encoder_seq) for seq in seqs)
            status = self.block_manager.can_allocate(group)
            if status == AllocStatus.NEVER:
                self.waiting.popleft()
                for seq in seqs:
                    seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                out.ignored_seq_groups.append(group)
                continue
            self.out_of_blocks = status == AllocStatus.LATER
            if self.out_of_blocks or group.get_max_num_running_seqs() > budget_seqs or (
                    num_tokens > budget_tokens and scheduled):
                break
            self.waiting.popleft()
            self.block_manager.allocate(group)
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
            scheduled.append(group)
            self.running.append(group)
            budget_seqs -= group.get_max_num_running_seqs()
            budget_tokens -= num_tokens
        return scheduled

    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        """Preempt a RUNNING group: by swap when it has several sequences (they share blocks)
        and the swap pool has room, else by recompute, unless `preemption_mode` says which.
        Swapped groups queue in admission order, so the earliest returns first."""
        mode = self.config.preemption_mode
        if mode is None:
            mode = "recompute" if len(group.get_unfinished_seqs()) == 1 else "swap"
        if mode == "swap" and not self.block_manager.can_swap_out(group):
            mode = "recompute"
        self.stats.num_preemptions += 1
        if mode == "recompute":
            self.stats.num_recomputes += 1
            self._free_group(group)
            for seq in group.get_unfinished_seqs():
                seq.reset_for_recompute()
            self.waiting.appendleft(group)
        else:
            self.stats.num_swap_outs += 1
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(group))
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(group)

    def _metadata(self, group: SequenceGroup, is_prompt: bool) -> SequenceGroupMetadata:
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        return SequenceGroupMetadata(
            request_id=group.request_id,
            is_prompt=is_prompt,
            seq_data={s.seq_id: s.data for s in seqs},
            sampling_params=group.sampling_params,
            block_tables={s.seq_id: self.block_manager.get_block_table(s) for s in seqs},
            encoder_seq_data=group.encoder_seq.data,
            cross_block_table=self.block_manager.get_cross_block_table(group),
            encoder_features=group.encoder_features if is_prompt else None,
            prompt_cross_kv=group.prompt_cross_kv if is_prompt else None,
            generators=group.generators,
        )
