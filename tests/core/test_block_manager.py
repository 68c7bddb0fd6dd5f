"""Block manager unit tests on the free-block arithmetic of docs/design.md ("The two kinds of
block tables")."""
import itertools

import pytest

from encdec.core.block_manager import AllocStatus, BlockSpaceManager
from encdec.sampling.params import SamplingParams
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
_ids = itertools.count()


def make_group(encoder_len: int, decoder_len: int) -> SequenceGroup:
    seq = Sequence(next(_ids), list(range(100, 100 + decoder_len)), BLOCK_SIZE)
    encoder_seq = Sequence(next(_ids), list(range(encoder_len)), BLOCK_SIZE)
    return SequenceGroup(f"req-{next(_ids)}", [seq], SamplingParams(), arrival_time=0.0,
                         encoder_seq=encoder_seq)


def make_manager(num_gpu_blocks: int = 32, num_cpu_blocks: int = 32,
                 watermark: float = 0.0) -> BlockSpaceManager:
    return BlockSpaceManager(BLOCK_SIZE, num_gpu_blocks, num_cpu_blocks, watermark)


def set_status(seq_group: SequenceGroup, status: SequenceStatus) -> None:
    for seq in seq_group.get_unfinished_seqs():
        seq.status = status


def admit(bm: BlockSpaceManager, seq_group: SequenceGroup) -> None:
    assert bm.can_allocate(seq_group) == AllocStatus.OK
    bm.allocate(seq_group)
    set_status(seq_group, SequenceStatus.RUNNING)


def group_blocks(bm: BlockSpaceManager, seq_group: SequenceGroup) -> int:
    """|cross attn block table| + sum_i |seq_i decoder self attn block table| (docs/design.md)."""
    return (len(bm.get_cross_block_table(seq_group))
            + sum(len(bm.get_block_table(seq)) for seq in seq_group.get_unfinished_seqs()))


def append_token(bm: BlockSpaceManager, seq: Sequence) -> list[tuple[int, int]]:
    seq.append_token_id(7, 0.0)
    return bm.append_slots(seq)


def test_allocate_and_free_arithmetic():
    bm = make_manager()
    group = make_group(encoder_len=10, decoder_len=5)
    (seq,) = group.get_seqs()
    free_gpu = bm.get_num_free_gpu_blocks()

    bm.allocate(group)
    bm.check_invariants()
    assert len(bm.get_cross_block_table(group)) == 3  # ceil(10 / 4)
    assert len(bm.get_block_table(seq)) == 2  # ceil(5 / 4)
    assert bm.get_num_free_gpu_blocks() == free_gpu - group_blocks(bm, group)
    assert not set(bm.get_cross_block_table(group)) & set(bm.get_block_table(seq))

    free_gpu = bm.get_num_free_gpu_blocks()
    self_blocks = len(bm.get_block_table(seq))
    bm.free(seq)
    assert bm.get_num_free_gpu_blocks() == free_gpu + self_blocks

    free_gpu = bm.get_num_free_gpu_blocks()
    cross_blocks = len(bm.get_cross_block_table(group))
    bm.free_cross(group)
    assert bm.get_num_free_gpu_blocks() == free_gpu + cross_blocks
    assert bm.get_num_free_gpu_blocks() == 32
    bm.check_invariants()


def test_free_without_tables_is_a_noop():
    bm = make_manager()
    group = make_group(encoder_len=3, decoder_len=3)
    bm.free(group.get_seqs()[0])
    bm.free_cross(group)
    assert bm.get_num_free_gpu_blocks() == 32
    bm.check_invariants()


def test_every_block_id_is_usable_starting_at_zero():
    bm = make_manager(num_gpu_blocks=8)
    group = make_group(encoder_len=16, decoder_len=16)  # 4 + 4 blocks
    admit(bm, group)
    used = bm.get_cross_block_table(group) + bm.get_block_table(group.get_seqs()[0])
    assert sorted(used) == list(range(8))
    assert bm.get_num_free_gpu_blocks() == 0
    bm.check_invariants()


def test_watermark_later_versus_never():
    bm = make_manager(num_gpu_blocks=10, watermark=0.2)  # 2 watermark blocks
    assert bm.watermark_blocks == 2
    assert make_manager(num_gpu_blocks=256, watermark=0.01).watermark_blocks == 2  # vLLM's: 2.56 rounds down
    too_big = make_group(encoder_len=20, decoder_len=13)  # 5 + 4 = 9 > 10 - 2
    assert bm.can_allocate(too_big) == AllocStatus.NEVER
    fits_alone = make_group(encoder_len=20, decoder_len=12)  # 5 + 3 = 8 = 10 - 2
    assert bm.can_allocate(fits_alone) == AllocStatus.OK

    small = make_group(encoder_len=1, decoder_len=1)  # 1 + 1
    admit(bm, small)
    assert bm.can_allocate(fits_alone) == AllocStatus.LATER  # 8 free - 8 < 2
    bm.free(small.get_seqs()[0])
    bm.free_cross(small)
    assert bm.can_allocate(fits_alone) == AllocStatus.OK


def test_admission_rule_keeps_the_watermark():
    bm = make_manager(num_gpu_blocks=10, watermark=0.2)  # 2 watermark blocks
    assert bm.max_num_blocks(num_encoder_tokens=9, max_decoder_len=5, num_seqs=2) == 3 + 2 * 2
    assert bm.can_ever_fit(8) and not bm.can_ever_fit(9)
    for decoder_len, fits in ((12, True), (13, False)):  # 5 cross + 3 or 4 self blocks
        status = bm.can_allocate(make_group(encoder_len=20, decoder_len=decoder_len))
        assert (status != AllocStatus.NEVER) == fits == bm.can_ever_fit(
            bm.max_num_blocks(20, decoder_len, 1))


def test_can_allocate_counts_cross_and_every_waiting_seq():
    bm = make_manager(num_gpu_blocks=6)
    group = make_group(encoder_len=8, decoder_len=4)  # 2 + 1
    group.add(Sequence(next(_ids), [1, 2, 3, 4, 5], BLOCK_SIZE))  # + 2 = 5
    assert bm.can_allocate(group) == AllocStatus.OK
    group.add(Sequence(next(_ids), [1, 2, 3, 4, 5], BLOCK_SIZE))  # + 2 = 7 > 6
    assert bm.can_allocate(group) == AllocStatus.NEVER
    group.get_seqs()[-1].status = SequenceStatus.FINISHED_STOPPED  # not waiting: not counted
    bm.allocate(group)
    assert bm.get_num_free_gpu_blocks() == 6 - group_blocks(bm, group) == 1
    bm.check_invariants()


def test_append_slots_allocates_a_block_when_the_last_one_is_full():
    bm = make_manager()
    group = make_group(encoder_len=4, decoder_len=4)
    admit(bm, group)
    (seq,) = group.get_seqs()
    free_gpu = bm.get_num_free_gpu_blocks()
    assert bm.can_append_slots(group)
    assert append_token(bm, seq) == []
    assert len(bm.get_block_table(seq)) == 2
    assert bm.get_num_free_gpu_blocks() == free_gpu - 1
    for _ in range(3):  # fills the new block
        assert append_token(bm, seq) == []
    assert bm.get_num_free_gpu_blocks() == free_gpu - 1
    bm.check_invariants()


def fork_children(bm: BlockSpaceManager, group: SequenceGroup, num_children: int) -> None:
    parent = group.get_seqs()[0]
    for _ in range(num_children):
        child = parent.fork(next(_ids))
        group.add(child)
        bm.fork(parent, child)


def test_can_append_slots_counts_new_blocks_and_copies():
    """After the step's token is appended: k sharers of a last block need k - 1 copies, a
    table a block short needs a new block, a private last block with room needs nothing."""
    bm = make_manager(num_gpu_blocks=5)
    group = make_group(encoder_len=4, decoder_len=6)  # 1 + 2 blocks, the last half full
    admit(bm, group)
    fork_children(bm, group, 2)
    seqs = group.get_seqs()
    for seq in seqs:
        seq.append_token_id(7, 0.0)
    assert bm.get_num_free_gpu_blocks() == 2
    assert bm.can_append_slots(group)  # 3 sharers, 2 copies
    assert sum(len(bm.append_slots(seq)) for seq in seqs) == 2
    assert bm.get_num_free_gpu_blocks() == 0
    for seq in seqs:
        seq.append_token_id(7, 0.0)  # the 8th token fills each private last block
    assert bm.can_append_slots(group)
    for seq in seqs:
        assert bm.append_slots(seq) == []
        seq.append_token_id(7, 0.0)  # the 9th needs a new block each
    assert not bm.can_append_slots(group)
    seqs[-1].status = SequenceStatus.FINISHED_STOPPED
    bm.free(seqs[-1])  # returns its private last block
    assert not bm.can_append_slots(group)  # 2 new blocks, 1 free
    seqs[-2].status = SequenceStatus.FINISHED_STOPPED
    bm.free(seqs[-2])
    assert bm.can_append_slots(group)
    bm.check_invariants()


def test_can_append_slots_when_some_sharers_do_not_write():
    bm = make_manager(num_gpu_blocks=4)
    group = make_group(encoder_len=4, decoder_len=6)
    admit(bm, group)
    fork_children(bm, group, 2)
    writer, *others = group.get_seqs()
    for seq in others:
        seq.status = SequenceStatus.FINISHED_STOPPED  # finished, but its table is still held
    writer.append_token_id(7, 0.0)
    free = bm.get_num_free_gpu_blocks()
    assert free == 1 and bm.can_append_slots(group)  # the writer copies the block it shares
    assert len(bm.append_slots(writer)) == 1
    assert bm.get_num_free_gpu_blocks() == 0


def test_fork_shares_blocks_and_copy_on_write():
    bm = make_manager()
    group = make_group(encoder_len=5, decoder_len=6)  # last self block half full
    admit(bm, group)
    parent = group.get_seqs()[0]
    free_gpu = bm.get_num_free_gpu_blocks()

    child = parent.fork(next(_ids))
    group.add(child)
    bm.fork(parent, child)
    bm.check_invariants()
    first, last = bm.get_block_table(parent)
    assert bm.get_block_table(child) == [first, last]
    assert bm.get_ref_count(first) == bm.get_ref_count(last) == 2
    assert bm.get_num_free_gpu_blocks() == free_gpu  # sharing costs nothing

    ((src, dst),) = append_token(bm, child)
    assert src == last and dst not in (first, last)
    assert bm.get_block_table(child) == [first, dst]
    assert bm.get_ref_count(first) == 2
    assert bm.get_ref_count(last) == bm.get_ref_count(dst) == 1
    assert bm.get_num_free_gpu_blocks() == free_gpu - 1

    assert append_token(bm, parent) == []  # its last block is private now
    assert bm.get_block_table(parent) == [first, last]
    bm.check_invariants()

    bm.free(child)
    assert bm.get_ref_count(first) == 1
    assert bm.get_ref_count(dst) == 0
    bm.check_invariants()


def test_fork_at_a_block_boundary_needs_no_copy():
    bm = make_manager()
    group = make_group(encoder_len=5, decoder_len=4)  # last self block full
    admit(bm, group)
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    bm.fork(parent, child)
    (shared,) = bm.get_block_table(parent)
    assert append_token(bm, parent) == []
    assert append_token(bm, child) == []
    assert bm.get_block_table(parent)[0] == bm.get_block_table(child)[0] == shared
    assert bm.get_block_table(parent)[1] != bm.get_block_table(child)[1]
    assert bm.get_ref_count(shared) == 2
    bm.check_invariants()


def test_swap_out_and_in_arithmetic():
    bm = make_manager()
    group = make_group(encoder_len=9, decoder_len=6)
    admit(bm, group)
    (seq,) = group.get_seqs()
    gpu_self, gpu_cross = bm.get_block_table(seq), bm.get_cross_block_table(group)
    blocks = group_blocks(bm, group)
    free_gpu, free_cpu = bm.get_num_free_gpu_blocks(), bm.get_num_free_cpu_blocks()
    assert bm.num_cross_gpu_blocks() == len(gpu_cross) == 3  # 9 encoder positions, 4 a block

    assert bm.can_swap_out(group)
    mapping = bm.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    bm.check_invariants()
    assert bm.get_num_free_gpu_blocks() == free_gpu + blocks
    assert bm.get_num_free_cpu_blocks() == free_cpu - blocks
    assert len(mapping) == blocks
    to_cpu = dict(mapping)
    assert set(to_cpu) == set(gpu_self + gpu_cross)
    assert bm.get_block_table(seq) == [to_cpu[b] for b in gpu_self]
    assert bm.get_cross_block_table(group) == [to_cpu[b] for b in gpu_cross]  # cross swapped too
    assert bm.is_swapped_out(seq) and bm.num_cross_gpu_blocks() == 0

    cpu_self, cpu_cross = bm.get_block_table(seq), bm.get_cross_block_table(group)
    free_gpu, free_cpu = bm.get_num_free_gpu_blocks(), bm.get_num_free_cpu_blocks()
    assert bm.can_swap_in(group) == AllocStatus.OK
    mapping = bm.swap_in(group)
    set_status(group, SequenceStatus.RUNNING)
    bm.check_invariants()
    assert bm.get_num_free_gpu_blocks() == free_gpu - blocks
    assert bm.get_num_free_cpu_blocks() == free_cpu + blocks
    to_gpu = dict(mapping)
    assert set(to_gpu) == set(cpu_self + cpu_cross)
    assert bm.get_block_table(seq) == [to_gpu[b] for b in cpu_self]
    assert bm.get_cross_block_table(group) == [to_gpu[b] for b in cpu_cross]
    assert not bm.is_swapped_out(seq) and bm.num_cross_gpu_blocks() == 3
    assert bm.get_num_free_cpu_blocks() == 32


def test_free_while_swapped_returns_blocks_to_the_cpu_pool():
    bm = make_manager()
    group = make_group(encoder_len=9, decoder_len=6)
    admit(bm, group)
    (seq,) = group.get_seqs()
    bm.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    free_gpu, free_cpu = bm.get_num_free_gpu_blocks(), bm.get_num_free_cpu_blocks()
    self_blocks = len(bm.get_block_table(seq))
    bm.free(seq)
    assert bm.get_num_free_cpu_blocks() == free_cpu + self_blocks
    cross_blocks = len(bm.get_cross_block_table(group))
    bm.free_cross(group)
    assert bm.get_num_free_cpu_blocks() == free_cpu + self_blocks + cross_blocks == 32
    assert bm.get_num_free_gpu_blocks() == free_gpu == 32
    bm.check_invariants()


def test_swap_copies_a_shared_block_once_and_keeps_it_shared():
    bm = make_manager()
    group = make_group(encoder_len=4, decoder_len=6)
    admit(bm, group)
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    bm.fork(parent, child)
    append_token(bm, child)  # child's last block is now private
    first = bm.get_block_table(parent)[0]
    unique = set(bm.get_block_table(parent) + bm.get_block_table(child)
                 + bm.get_cross_block_table(group))
    assert len(unique) == 4  # cross 1 + shared first 1 + two last blocks
    free_gpu, free_cpu = bm.get_num_free_gpu_blocks(), bm.get_num_free_cpu_blocks()

    mapping = bm.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    bm.check_invariants()
    assert sorted(src for src, _ in mapping) == sorted(unique)
    assert bm.get_num_free_gpu_blocks() == free_gpu + 4
    assert bm.get_num_free_cpu_blocks() == free_cpu - 4
    cpu_first = dict(mapping)[first]
    assert bm.get_block_table(parent)[0] == bm.get_block_table(child)[0] == cpu_first
    assert bm.get_ref_count(cpu_first, device="cpu") == 2

    assert bm.can_swap_in(group) == AllocStatus.OK
    mapping = bm.swap_in(group)
    set_status(group, SequenceStatus.RUNNING)
    bm.check_invariants()
    assert len(mapping) == 4
    gpu_first = dict(mapping)[cpu_first]
    assert bm.get_block_table(parent)[0] == bm.get_block_table(child)[0] == gpu_first
    assert bm.get_ref_count(gpu_first) == 2
    assert bm.get_num_free_cpu_blocks() == 32


def test_can_swap_out_needs_room_in_the_cpu_pool():
    bm = make_manager(num_cpu_blocks=4)
    group = make_group(encoder_len=9, decoder_len=6)  # 3 + 2 blocks
    admit(bm, group)
    assert not bm.can_swap_out(group)
    seq = group.get_seqs()[0]
    seq.status = SequenceStatus.FINISHED_STOPPED
    bm.free(seq)
    assert bm.can_swap_out(group)  # the cross table alone fits


def test_can_swap_in_later_and_never():
    bm = make_manager(num_gpu_blocks=10, num_cpu_blocks=10, watermark=0.2)
    group = make_group(encoder_len=12, decoder_len=8)  # 3 + 2 blocks, +1 to grow = 6
    admit(bm, group)
    bm.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    assert bm.can_swap_in(group) == AllocStatus.OK
    group.get_seqs()[0].append_token_id(7, 0.0)  # the 9th token needs a third block
    assert bm.can_swap_in(group) == AllocStatus.OK  # 10 free - 6 >= 2

    other = make_group(encoder_len=4, decoder_len=4)  # 2 blocks
    admit(bm, other)
    assert bm.can_swap_in(group) == AllocStatus.OK  # 8 - 6 >= 2
    append_token(bm, other.get_seqs()[0])
    assert bm.can_swap_in(group) == AllocStatus.LATER  # 7 - 6 < 2

    small = BlockSpaceManager(BLOCK_SIZE, 8, 10, watermark=0.375)  # 3 watermark blocks
    group = make_group(encoder_len=12, decoder_len=8)
    admit(small, group)  # 5 blocks: 8 - 5 >= 3
    small.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    group.get_seqs()[0].append_token_id(7, 0.0)
    assert small.can_swap_in(group) == AllocStatus.NEVER  # 5 + 1 > 8 - 3


def test_can_swap_in_counts_one_copy_fewer_than_sharers():
    """Two sequences sharing a half-full last block need one copy, not two, to swap in."""
    bm = make_manager(num_gpu_blocks=4, num_cpu_blocks=4)
    group = make_group(encoder_len=4, decoder_len=6)  # 1 + 2 blocks
    admit(bm, group)
    fork_children(bm, group, 1)
    bm.swap_out(group)
    set_status(group, SequenceStatus.SWAPPED)
    for seq in group.get_seqs():
        seq.append_token_id(7, 0.0)
    assert bm.can_swap_in(group) == AllocStatus.OK  # 3 blocks + 1 copy = 4
    bm.swap_in(group)
    set_status(group, SequenceStatus.RUNNING)
    assert sum(len(bm.append_slots(seq)) for seq in group.get_seqs()) == 1
    assert bm.get_num_free_gpu_blocks() == 0
    bm.check_invariants()


def test_recompute_preemption_frees_both_tables_and_readmission_works():
    bm = make_manager()
    group = make_group(encoder_len=9, decoder_len=3)
    admit(bm, group)
    (seq,) = group.get_seqs()
    for _ in range(6):
        append_token(bm, seq)

    bm.free(seq)
    bm.free_cross(group)
    seq.reset_for_recompute()
    assert bm.get_num_free_gpu_blocks() == 32
    bm.check_invariants()

    admit(bm, group)
    assert len(bm.get_block_table(seq)) == 3  # prompt + generated tokens
    assert len(bm.get_cross_block_table(group)) == 3
    assert bm.get_num_free_gpu_blocks() == 32 - group_blocks(bm, group)
    bm.check_invariants()


def test_allocate_refuses_a_leftover_cross_table():
    bm = make_manager()
    group = make_group(encoder_len=9, decoder_len=3)
    admit(bm, group)
    seq = group.get_seqs()[0]
    bm.free(seq)
    seq.reset_for_recompute()
    with pytest.raises(AssertionError, match="cross table"):  # vLLM v0 leaked it instead
        bm.allocate(group)


def test_reset_frees_everything():
    bm = make_manager()
    running, swapped = make_group(9, 6), make_group(5, 5)
    admit(bm, running)
    admit(bm, swapped)
    bm.swap_out(swapped)
    set_status(swapped, SequenceStatus.SWAPPED)
    bm.reset()
    bm.check_invariants()
    assert bm.get_num_free_gpu_blocks() == 32
    assert bm.get_num_free_cpu_blocks() == 32
    assert not bm.block_tables and not bm.cross_block_tables


def test_check_invariants_detects_corruption():
    bm = make_manager()
    group = make_group(encoder_len=9, decoder_len=6)
    admit(bm, group)
    bm.gpu_pool.ref_counts[bm.get_block_table(group.get_seqs()[0])[0]] += 1
    with pytest.raises(AssertionError, match="ref counts"):
        bm.check_invariants()

    bm = make_manager()
    a, b = make_group(4, 4), make_group(4, 4)
    admit(bm, a)
    admit(bm, b)
    bm.gpu_pool.decref(bm.cross_block_tables[b.request_id][0])
    bm.cross_block_tables[b.request_id] = list(bm.cross_block_tables[a.request_id])
    bm.gpu_pool.incref(bm.cross_block_tables[a.request_id][0])
    with pytest.raises(AssertionError, match="cross block is shared"):
        bm.check_invariants()
