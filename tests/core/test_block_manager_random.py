"""Seeded random operations on the block manager, checked after every one.

Besides the bookkeeping invariants, a fake KV cache (one token id per slot, one array per pool)
follows every prefill, copy-on-write and swap mapping, so a wrong table or mapping shows up as
a sequence reading back the wrong tokens.
"""
import collections
import itertools
import random

import numpy as np
import pytest

from encdec.core.block_manager import AllocStatus, BlockSpaceManager
from encdec.sampling.params import SamplingParams
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus

NUM_OPS = 4000
MAX_SEQS_PER_GROUP = 4
MAX_DECODER_LEN = 48


class Simulation:
    """A toy scheduler driving the block manager the way the engine does."""

    def __init__(self, seed: int, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 watermark: float):
        self.rng = random.Random(seed)
        self.block_size = block_size
        self.bm = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark)
        self.cache = {"gpu": np.full((num_gpu_blocks, block_size), -1),
                      "cpu": np.full((num_cpu_blocks, block_size), -1)}
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.ids = itertools.count()
        self.seen = collections.Counter()

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, 1 << 30) for _ in range(n)]

    def blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # Operations -------------------------------------------------------------------------

    def add(self) -> None:
        encoder_len = self.rng.randint(1, 12 * self.block_size)
        if self.rng.random() < 0.03:
            encoder_len = self.bm.num_total_gpu_blocks * self.block_size  # can never fit
        seq = Sequence(next(self.ids), self.tokens(self.rng.randint(1, 3 * self.block_size)),
                       self.block_size)
        encoder_seq = Sequence(next(self.ids), self.tokens(encoder_len), self.block_size)
        self.waiting.append(SequenceGroup(f"req-{next(self.ids)}", [seq], SamplingParams(),
                                          arrival_time=0.0, encoder_seq=encoder_seq))

    def admit(self) -> None:
        group = self.waiting[0]
        status = self.bm.can_allocate(group)
        self.seen[status] += 1
        if status == AllocStatus.NEVER:
            self.waiting.pop(0)
            self.abort(group)
            return
        if status == AllocStatus.LATER:
            return
        waiting = group.get_seqs(SequenceStatus.WAITING)
        needed = self.blocks(len(group.encoder_seq)) + sum(self.blocks(len(s)) for s in waiting)
        free_gpu = self.bm.get_num_free_gpu_blocks()
        self.bm.allocate(group)
        assert self.bm.get_num_free_gpu_blocks() == free_gpu - needed
        self.waiting.pop(0)
        for seq in waiting:
            seq.status = SequenceStatus.RUNNING
            self.write(self.bm.get_block_table(seq), seq.data.get_token_ids(), 0)
        self.write(self.bm.get_cross_block_table(group), group.encoder_seq.data.get_token_ids(), 0)
        self.running.append(group)

    def step(self) -> None:
        """One decode step of a running group: append a token to each running seq."""
        group = self.rng.choice(self.running)
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        if max(len(seq) for seq in seqs) >= MAX_DECODER_LEN:
            self.finish(group)
            return
        for seq in seqs:
            seq.append_token_id(self.rng.randrange(1, 1 << 30), 0.0)
        if not self.bm.can_append_slots(group):  # asked after the append, as by the scheduler
            for seq in seqs:
                seq.data.output_token_ids.pop()  # the step does not happen
            self.preempt(group)
            return
        copies = []
        for seq in seqs:
            copies += self.bm.append_slots(seq)
        self.seen["copy_on_write"] += len(copies)
        if copies:
            src, dst = map(list, zip(*copies))
            self.cache["gpu"][dst] = self.cache["gpu"][src]
        for seq in seqs:
            self.write(self.bm.get_block_table(seq), seq.data.get_token_ids()[-1:], len(seq) - 1)

    def fork(self) -> None:
        group = self.rng.choice(self.running + self.swapped)
        if group.num_seqs() >= MAX_SEQS_PER_GROUP or not group.get_unfinished_seqs():
            return
        parent = self.rng.choice(group.get_unfinished_seqs())
        child = parent.fork(next(self.ids))
        group.add(child)
        self.bm.fork(parent, child)
        self.seen["fork"] += 1

    def finish_seq(self) -> None:
        group = self.rng.choice(self.running)
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        if len(seqs) > 1:
            seq = self.rng.choice(seqs)
            seq.status = SequenceStatus.FINISHED_STOPPED
            self.bm.free(seq)

    def finish(self, group: SequenceGroup) -> None:
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        self.abort(group)

    def abort(self, group: SequenceGroup) -> None:
        for seq in group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_ABORTED
            self.bm.free(seq)
        self.bm.free_cross(group)

    def preempt(self, group: SequenceGroup) -> None:
        if self.rng.random() < 0.5 and self.bm.can_swap_out(group):
            self.swap_out(group)
        else:
            self.recompute(group)

    def recompute(self, group: SequenceGroup) -> None:
        """Preemption by recompute: both kinds of table go, the group waits again."""
        (self.running if group in self.running else self.swapped).remove(group)
        for seq in group.get_unfinished_seqs():
            self.bm.free(seq)
            seq.reset_for_recompute()
        self.bm.free_cross(group)
        self.waiting.insert(0, group)
        self.seen["recompute"] += 1

    def swap_out(self, group: SequenceGroup) -> None:
        self.swap(group, "gpu", "cpu", self.bm.swap_out, SequenceStatus.SWAPPED)
        self.running.remove(group)
        self.swapped.append(group)

    def swap_in(self) -> None:
        group = self.swapped[0]
        if self.bm.can_swap_in(group) != AllocStatus.OK:
            return
        self.swap(group, "cpu", "gpu", self.bm.swap_in, SequenceStatus.RUNNING)
        self.swapped.pop(0)
        self.running.append(group)

    def swap(self, group, src: str, dst: str, move, new_status: SequenceStatus) -> None:
        """Move a group and check the block arithmetic: src += group blocks, dst -= them."""
        unique = {b for t in self.group_tables(group) for b in t}
        free = {"gpu": self.bm.get_num_free_gpu_blocks(), "cpu": self.bm.get_num_free_cpu_blocks()}
        mapping = move(group)
        assert sorted(s for s, _ in mapping) == sorted(unique)
        assert self.bm.get_num_free_gpu_blocks() - free["gpu"] == (
            len(unique) if src == "gpu" else -len(unique))
        assert self.bm.get_num_free_cpu_blocks() - free["cpu"] == (
            len(unique) if src == "cpu" else -len(unique))
        if mapping:
            from_blocks, to_blocks = map(list, zip(*mapping))
            self.cache[dst][to_blocks] = self.cache[src][from_blocks]
        for seq in group.get_unfinished_seqs():
            seq.status = new_status
        self.seen["swap_" + dst] += 1

    def reset(self) -> None:
        for group in self.waiting + self.running + self.swapped:
            for seq in group.get_unfinished_seqs():
                seq.status = SequenceStatus.FINISHED_ABORTED
        self.waiting, self.running, self.swapped = [], [], []
        self.bm.reset()
        assert self.bm.get_num_free_gpu_blocks() == self.bm.num_total_gpu_blocks
        assert self.bm.get_num_free_cpu_blocks() == self.bm.num_total_cpu_blocks
        self.seen["reset"] += 1

    def random_op(self) -> None:
        r = self.rng.random()
        if r < 0.002:
            self.reset()
        elif r < 0.15 or not (self.waiting or self.running or self.swapped):
            self.add()
        elif r < 0.30 and self.waiting:
            self.admit()
        elif r < 0.65 and self.running:
            self.step()
        elif r < 0.70 and (self.running or self.swapped):
            self.fork()
        elif r < 0.74 and self.running:
            self.finish_seq()
        elif r < 0.80:
            self.finish(self.rng.choice(self.waiting + self.running + self.swapped))
        elif r < 0.86 and self.running:
            group = self.rng.choice(self.running)
            if self.bm.can_swap_out(group):
                self.swap_out(group)
        elif r < 0.94 and self.swapped:
            self.swap_in()
        elif r < 1.0 and (self.running or self.swapped):
            self.recompute(self.rng.choice(self.running + self.swapped))

    # Checks -----------------------------------------------------------------------------

    def write(self, table: list[int], token_ids: list[int], start: int) -> None:
        slots = np.arange(start, start + len(token_ids))
        blocks = np.asarray(table)[slots // self.block_size]
        self.cache["gpu"][blocks, slots % self.block_size] = token_ids

    def read(self, table: list[int], device: str, n: int) -> list[int]:
        return self.cache[device][table].reshape(-1)[:n].tolist()

    def group_tables(self, group: SequenceGroup) -> list[list[int]]:
        return ([self.bm.get_block_table(s) for s in group.get_unfinished_seqs()]
                + [self.bm.get_cross_block_table(group)])

    def check(self) -> None:
        self.bm.check_invariants()
        for group in self.waiting:
            assert group.request_id not in self.bm.cross_block_tables
            assert all(s.seq_id not in self.bm.block_tables for s in group.get_seqs())
        for device, groups in (("gpu", self.running), ("cpu", self.swapped)):
            for group in groups:
                for seq in group.get_seqs():
                    if seq.is_finished():
                        assert seq.seq_id not in self.bm.block_tables
                        continue
                    assert self.bm.is_swapped_out(seq) == (device == "cpu")
                    table = self.bm.get_block_table(seq)
                    assert len(table) == self.blocks(len(seq))
                    assert self.read(table, device, len(seq)) == seq.data.get_token_ids()
                encoder = group.encoder_seq
                table = self.bm.get_cross_block_table(group)
                assert len(table) == self.blocks(len(encoder))
                assert self.read(table, device, len(encoder)) == encoder.data.get_token_ids()


@pytest.mark.parametrize("seed, block_size, num_gpu_blocks, num_cpu_blocks, watermark", [
    (0, 4, 48, 32, 0.01),
    (1, 1, 160, 96, 0.05),
    (2, 16, 12, 8, 0.0),
    (3, 2, 64, 0, 0.02),  # no swap space: preemption is by recompute only
    (4, 8, 40, 64, 0.1),
])
def test_random_operations_keep_the_invariants(seed, block_size, num_gpu_blocks,
                                               num_cpu_blocks, watermark):
    sim = Simulation(seed, block_size, num_gpu_blocks, num_cpu_blocks, watermark)
    for _ in range(NUM_OPS):
        sim.random_op()
        sim.check()
    for group in sim.waiting + sim.running + sim.swapped:
        sim.finish(group)
    sim.check()
    assert sim.bm.get_num_free_gpu_blocks() == num_gpu_blocks
    assert sim.bm.get_num_free_cpu_blocks() == num_cpu_blocks
    assert not sim.bm.block_tables and not sim.bm.cross_block_tables
    # The run must have exercised every path it is meant to test.
    for key in (AllocStatus.OK, AllocStatus.LATER, AllocStatus.NEVER, "fork", "recompute",
                "reset"):
        assert sim.seen[key] > 0, key
    # With one token per block every block is full when shared, so nothing is copied.
    assert (sim.seen["copy_on_write"] > 0) == (block_size > 1)
    if num_cpu_blocks:
        assert sim.seen["swap_cpu"] > 0 and sim.seen["swap_gpu"] > 0
