"""Paged KV-cache block bookkeeping for encoder/decoder models (docs/design.md, "The two kinds
of block tables").

vLLM v0 "block manager v1" semantics without prefix caching. Each device has one pool of
blocks (ids 0..num_blocks-1, all usable) that serves two kinds of table:

* a self-attention table per decoder `Sequence` (`block_tables[seq_id]`), and
* one cross-attention table per `SequenceGroup` (`cross_block_tables[request_id]`), sized for
  the group's encoder sequence.

Blocks are shared only between forked decoder sequences (n > 1, beam search), by reference
count; a shared last block is copied on write by `append_slots`.

Convention: the block manager never changes sequence statuses; the scheduler does. It calls
`allocate` while the decoder sequences are WAITING, `swap_out` while they are RUNNING and
`swap_in` while they are SWAPPED, and sets the new status afterwards. On preemption by
recompute it calls `free(seq)` for every sequence and `free_cross(seq_group)`, so re-admission
allocates both kinds of table afresh.
"""
from __future__ import annotations

import enum
from collections import Counter

from encdec.sequence import Sequence, SequenceGroup, SequenceStatus


class AllocStatus(enum.Enum):
    """Whether a group's blocks fit now (OK), after others finish (LATER), or never (NEVER)."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class BlockPool:
    """The blocks of one device: a free list and a reference count per block."""

    def __init__(self, device: str, num_blocks: int):
        self.device = device
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_blocks(self) -> list[int]:
        return list(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"out of {self.device} blocks ({self.num_blocks} in total)")
        block = self._free.pop()
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"{self.device} block {block} is free"
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        count = self.ref_counts[block]
        assert count > 0, f"double free of {self.device} block {block}"
        self.ref_counts[block] = count - 1
        if count == 1:
            self._free.append(block)


class BlockSpaceManager:
    """Maps decoder sequences and sequence groups to KV-cache blocks on the device and in swap.

    The device pool is called "gpu" and the swap pool "cpu", as in vLLM, even on CPU-only
    machines. `watermark` is the fraction of device blocks kept free when admitting or
    swapping in groups, so running sequences have room to grow.
    """

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 watermark: float = 0.01):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if num_gpu_blocks < 0 or num_cpu_blocks < 0:
            raise ValueError(f"block counts must be >= 0, got gpu={num_gpu_blocks} "
                             f"cpu={num_cpu_blocks}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.reset()

    def reset(self) -> None:
        """Drop every table; all blocks of both pools are free again."""
        self.gpu_pool = BlockPool("gpu", self.num_total_gpu_blocks)
        self.cpu_pool = BlockPool("cpu", self.num_total_cpu_blocks)
        self.block_tables: dict[int, list[int]] = {}
        self.cross_block_tables: dict[str, list[int]] = {}
        # Tables living in the cpu pool; every other table lives in the gpu pool.
        self._swapped_seqs: set[int] = set()
        self._swapped_groups: set[str] = set()

    # Allocation -------------------------------------------------------------------------

    def _allocate(self, num_blocks: int) -> list[int]:
        return [self.gpu_pool.allocate() for _ in range(num_blocks)]

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _num_required_blocks(self, seq_group: SequenceGroup) -> int:
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        return (self._num_blocks(len(seq_group.encoder_seq))
                + sum(self._num_blocks(len(seq)) for seq in waiting))

    def max_num_blocks(self, num_encoder_tokens: int, max_decoder_len: int, num_seqs: int) -> int:
        """The most device blocks a request ever holds: its cross table plus, for each decoder
        sequence it runs at once, a self table of `max_decoder_len` tokens."""
        return self._num_blocks(num_encoder_tokens) + num_seqs * self._num_blocks(max_decoder_len)

    def can_ever_fit(self, num_blocks: int) -> bool:
        """The admission rule: a request that may hold `num_blocks` device blocks is admitted
        (and swapped in) only if they fit an empty device with the watermark kept free.

        The engine applies it to `max_num_blocks` when a request arrives; `can_allocate` and
        `can_swap_in` apply it to what a group needs now, which is never more.
        """
        return num_blocks <= self.num_total_gpu_blocks - self.watermark_blocks

    def _alloc_status(self, num_required: int) -> AllocStatus:
        if not self.can_ever_fit(num_required):
            return AllocStatus.NEVER
        if self.gpu_pool.num_free - num_required < self.watermark_blocks:
            return AllocStatus.LATER
        return AllocStatus.OK

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Cross blocks for the encoder sequence plus self blocks for each WAITING sequence."""
        return self._alloc_status(self._num_required_blocks(seq_group))

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give each WAITING sequence its own self table and the group its cross table."""
        request_id = seq_group.request_id
        assert request_id not in self.cross_block_tables, f"{request_id} already has a cross table"
        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        for seq in waiting:
            assert seq.seq_id not in self.block_tables, f"seq {seq.seq_id} already has a table"
        num_required = self._num_required_blocks(seq_group)
        if num_required > self.gpu_pool.num_free:
            raise RuntimeError(f"{request_id} needs {num_required} gpu blocks, "
                               f"{self.gpu_pool.num_free} free")
        for seq in waiting:
            self.block_tables[seq.seq_id] = self._allocate(self._num_blocks(len(seq)))
        self.cross_block_tables[request_id] = self._allocate(self._num_blocks(len(seq_group.encoder_seq)))

    # Decoding ---------------------------------------------------------------------------

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """Whether `append_slots` of every RUNNING sequence finds the device blocks it takes."""
        running = seq_group.get_seqs(SequenceStatus.RUNNING)
        return self._num_append_blocks(running, self.gpu_pool) <= self.gpu_pool.num_free

    def _num_append_blocks(self, seqs: list[Sequence], pool: BlockPool) -> int:
        """Blocks the next `append_slots` of each of `seqs` takes: a new block where a table is
        a block short, else a copy of a shared last block. Of k sharers writing to a block,
        the last keeps it when they are all its sharers: k - 1 copies."""
        num_new = 0
        writers: Counter[int] = Counter()
        for seq in seqs:
            table = self.block_tables[seq.seq_id]
            if len(table) < self._num_blocks(len(seq)):
                num_new += 1
            elif pool.ref_counts[table[-1]] > 1:
                writers[table[-1]] += 1
        return num_new + sum(min(k, pool.ref_counts[block] - 1) for block, k in writers.items())

    def append_slots(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make the table of `seq` cover all its tokens; return copy-on-write (src, dst) pairs.

        Called once per decode step after the step's token was appended, so the table is at
        most one block short. A new block is fresh; otherwise a shared last block (the one
        the new token is written to) is replaced by a private copy.
        """
        table = self.block_tables[seq.seq_id]
        assert seq.seq_id not in self._swapped_seqs, f"seq {seq.seq_id} is swapped out"
        num_blocks = self._num_blocks(len(seq))
        assert len(table) >= num_blocks - 1, (
            f"seq {seq.seq_id} has {len(table)} blocks, needs {num_blocks}")
        if len(table) < num_blocks:
            table.append(self.gpu_pool.allocate())
            return []
        last = table[-1]
        if self.gpu_pool.ref_counts[last] == 1:
            return []
        new = self.gpu_pool.allocate()
        self.gpu_pool.decref(last)
        table[-1] = new
        return [(last, new)]

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child shares every block of the parent's table."""
        assert child_seq.seq_id not in self.block_tables, f"seq {child_seq.seq_id} has a table"
        table = self.block_tables[parent_seq.seq_id]
        pool = self._pool(parent_seq.seq_id in self._swapped_seqs)
        for block in table:
            pool.incref(block)
        self.block_tables[child_seq.seq_id] = list(table)
        if parent_seq.seq_id in self._swapped_seqs:
            self._swapped_seqs.add(child_seq.seq_id)

    # Freeing ----------------------------------------------------------------------------

    def _pool(self, on_cpu: bool) -> BlockPool:
        return self.cpu_pool if on_cpu else self.gpu_pool

    def free(self, seq: Sequence) -> None:
        """Release the self table of `seq` wherever it lives; no-op if it has none."""
        table = self.block_tables.pop(seq.seq_id, None)
        if table is None:
            return
        pool = self._pool(seq.seq_id in self._swapped_seqs)
        self._swapped_seqs.discard(seq.seq_id)
        for block in table:
            pool.decref(block)

    def free_cross(self, seq_group: SequenceGroup) -> None:
        """Release the cross table of `seq_group` wherever it lives; no-op if it has none."""
        request_id = seq_group.request_id
        table = self.cross_block_tables.pop(request_id, None)
        if table is None:
            return
        pool = self._pool(request_id in self._swapped_groups)
        self._swapped_groups.discard(request_id)
        for block in table:
            pool.decref(block)

    # Swapping ---------------------------------------------------------------------------

    def _tables_to_swap(self, seq_group: SequenceGroup, status: SequenceStatus,
                        on_cpu: bool) -> list[list[int]]:
        """Self tables of the group's `status` sequences plus its cross table, on one side."""
        tables = []
        for seq in seq_group.get_seqs(status):
            assert (seq.seq_id in self._swapped_seqs) == on_cpu, (
                f"{status.name} seq {seq.seq_id} has its table in the wrong pool")
            tables.append(self.block_tables[seq.seq_id])
        request_id = seq_group.request_id
        if (request_id in self.cross_block_tables
                and (request_id in self._swapped_groups) == on_cpu):
            tables.append(self.cross_block_tables[request_id])
        return tables

    @staticmethod
    def _num_unique_blocks(tables: list[list[int]]) -> int:
        return len({block for table in tables for block in table})

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        """The group's swapped blocks plus those the SWAPPED sequences' next `append_slots`
        takes (the scheduler appends right after swapping in)."""
        tables = self._tables_to_swap(seq_group, SequenceStatus.SWAPPED, on_cpu=True)
        growth = self._num_append_blocks(seq_group.get_seqs(SequenceStatus.SWAPPED), self.cpu_pool)
        return self._alloc_status(self._num_unique_blocks(tables) + growth)

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the SWAPPED sequences' tables and the cross table to the device.

        Returns (cpu block, gpu block) pairs; a shared block is copied once and stays shared.
        """
        seqs = seq_group.get_seqs(SequenceStatus.SWAPPED)
        tables = self._tables_to_swap(seq_group, SequenceStatus.SWAPPED, on_cpu=True)
        mapping = self._move(tables, self.cpu_pool, self.gpu_pool)
        self._swapped_seqs.difference_update(seq.seq_id for seq in seqs)
        self._swapped_groups.discard(seq_group.request_id)
        return mapping

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        tables = self._tables_to_swap(seq_group, SequenceStatus.RUNNING, on_cpu=False)
        return self._num_unique_blocks(tables) <= self.cpu_pool.num_free

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the RUNNING sequences' tables and the cross table to swap space.

        Returns (gpu block, cpu block) pairs; a shared block is copied once and stays shared.
        """
        seqs = seq_group.get_seqs(SequenceStatus.RUNNING)
        tables = self._tables_to_swap(seq_group, SequenceStatus.RUNNING, on_cpu=False)
        mapping = self._move(tables, self.gpu_pool, self.cpu_pool)
        self._swapped_seqs.update(seq.seq_id for seq in seqs)
        if seq_group.request_id in self.cross_block_tables:
            self._swapped_groups.add(seq_group.request_id)
        return mapping

    @staticmethod
    def _move(tables: list[list[int]], src: BlockPool, dst: BlockPool) -> list[tuple[int, int]]:
        """Rewrite `tables` in place from `src` to `dst` blocks, one new block per old one."""
        num_required = BlockSpaceManager._num_unique_blocks(tables)
        if num_required > dst.num_free:
            raise RuntimeError(f"swap needs {num_required} {dst.device} blocks, "
                               f"{dst.num_free} free")
        mapping: dict[int, int] = {}
        for table in tables:
            for i, block in enumerate(table):
                new = mapping.get(block)
                if new is None:
                    new = mapping[block] = dst.allocate()
                else:
                    dst.incref(new)
                src.decref(block)
                table[i] = new
        return list(mapping.items())

    # Queries ----------------------------------------------------------------------------

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_pool.num_free

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_pool.num_free

    def num_cross_gpu_blocks(self) -> int:
        """Device blocks of the cross-attention tables (a swapped-out group's are in swap space)."""
        return sum(len(table) for request_id, table in list(self.cross_block_tables.items())
                   if request_id not in self._swapped_groups)

    def get_block_table(self, seq: Sequence) -> list[int]:
        return list(self.block_tables[seq.seq_id])

    def get_cross_block_table(self, seq_group: SequenceGroup) -> list[int]:
        return list(self.cross_block_tables[seq_group.request_id])

    def get_ref_count(self, block_id: int, device: str = "gpu") -> int:
        pools = {"gpu": self.gpu_pool, "cpu": self.cpu_pool}
        if device not in pools:
            raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
        return pools[device].ref_counts[block_id]

    def is_swapped_out(self, seq: Sequence) -> bool:
        """Whether the self table of `seq` lives in swap space."""
        return seq.seq_id in self._swapped_seqs

    def check_invariants(self) -> None:
        """Raise AssertionError unless the tables and both pools agree.

        Per pool: every block is either free or referenced, never both; a block's reference
        count is the number of table entries naming it; cross blocks belong to exactly one
        table (never shared between groups, nor with a self table).
        """
        for on_cpu in (False, True):
            pool = self._pool(on_cpu)
            counts = [0] * pool.num_blocks
            for seq_id, table in self.block_tables.items():
                if (seq_id in self._swapped_seqs) == on_cpu:
                    for block in table:
                        counts[block] += 1
            cross_blocks = [block for request_id, table in self.cross_block_tables.items()
                            if (request_id in self._swapped_groups) == on_cpu
                            for block in table]
            for block in cross_blocks:
                counts[block] += 1
            _check(counts == pool.ref_counts, f"{pool.device} ref counts disagree with tables")
            _check(all(counts[block] == 1 for block in cross_blocks),
                   f"a {pool.device} cross block is shared")
            free = pool.free_blocks()
            _check(len(set(free)) == len(free), f"{pool.device} free list has duplicates")
            _check(all(counts[block] == 0 for block in free),
                   f"a {pool.device} block is both free and referenced")
            num_used = sum(1 for count in counts if count > 0)
            _check(len(free) + num_used == pool.num_blocks,
                   f"{pool.device}: {len(free)} free + {num_used} used != {pool.num_blocks}")
        _check(self._swapped_seqs <= self.block_tables.keys(), "stale swapped seq ids")
        _check(self._swapped_groups <= self.cross_block_tables.keys(), "stale swapped groups")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
