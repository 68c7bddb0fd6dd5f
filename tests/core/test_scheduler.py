"""Scheduler unit tests on hand-made sequence groups; `step` plays the engine's part."""
import itertools

from encdec.config import CacheConfig, SchedulerConfig
from encdec.core.scheduler import Scheduler
from encdec.sampling.params import SamplingParams
from encdec.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
_ids = itertools.count()


def make_group(request_id: str, encoder_len: int = 4, decoder_len: int = 4,
               n: int = 1, arrival_time: float = 0.0) -> SequenceGroup:
    seq = Sequence(next(_ids), [2] * decoder_len, BLOCK_SIZE)
    encoder_seq = Sequence(next(_ids), list(range(encoder_len)), BLOCK_SIZE)
    return SequenceGroup(request_id, [seq], SamplingParams(n=n, temperature=1.0),
                         arrival_time=arrival_time, encoder_seq=encoder_seq)


def make_scheduler(num_gpu_blocks: int, num_cpu_blocks: int = 0, max_num_seqs: int = 256,
                   max_num_batched_tokens: int = 1024, preemption_mode=None,
                   max_running_requests=None) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             preemption_mode=preemption_mode, max_running_requests=max_running_requests)
    cache = CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=num_gpu_blocks, watermark=0.0)
    return Scheduler(config, cache, num_gpu_blocks, num_cpu_blocks)


def add(scheduler: Scheduler, *groups: SequenceGroup) -> None:
    for group in groups:
        scheduler.add_seq_group(group)


def step(scheduler: Scheduler):
    """Schedule, then append a sampled token to every running sequence of the scheduled groups."""
    _, out = scheduler.schedule()
    for group in out.scheduled_seq_groups:
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.append_token_id(7, 0.0)
    scheduler.block_manager.check_invariants()
    return out


def ids(groups) -> list[str]:
    return [group.request_id for group in groups]


def finish(scheduler: Scheduler, group: SequenceGroup) -> None:
    for seq in group.get_unfinished_seqs():
        seq.status = SequenceStatus.FINISHED_STOPPED
        scheduler.free_seq(seq)
    assert group in scheduler.free_finished_seq_groups()


def fork(scheduler: Scheduler, group: SequenceGroup) -> None:
    """What the engine does when a sequence samples a second token (n > 1, beam search)."""
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    scheduler.block_manager.fork(parent, child)


def assert_all_free(scheduler: Scheduler) -> None:
    bm = scheduler.block_manager
    bm.check_invariants()
    assert bm.get_num_free_gpu_blocks() == bm.num_total_gpu_blocks
    assert bm.get_num_free_cpu_blocks() == bm.num_total_cpu_blocks
    assert not bm.block_tables and not bm.cross_block_tables


def test_admission_under_the_sequence_budget_in_fcfs_order():
    s = make_scheduler(num_gpu_blocks=64, max_num_seqs=2)
    a, b, c = make_group("a"), make_group("b", n=2), make_group("c")
    add(s, a, b, c)
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["a"] and out.num_prefill_groups == 1
    assert ids(s.waiting) == ["b", "c"]  # b needs 2 sequences, 1 is left; c waits behind it
    assert ids(step(s).scheduled_seq_groups) == ["a"]
    finish(s, a)
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["b"] and ids(s.waiting) == ["c"]


def test_a_request_that_arrived_earlier_waits_ahead_of_later_ones():
    """A Whisper window's fallback carries its upload's arrival: it waits ahead of the windows
    of uploads that came after, not behind everything queued meanwhile (equal times: in order)."""
    s = make_scheduler(num_gpu_blocks=64, max_num_seqs=1)
    a, b, c = (make_group(name, arrival_time=t) for name, t in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    add(s, a, b, c, make_group("b-fallback", arrival_time=2.0), make_group("a-next", arrival_time=1.0))
    assert ids(s.waiting) == ["a", "a-next", "b", "b-fallback", "c"]
    assert ids(step(s).scheduled_seq_groups) == ["a"]


def test_admission_stops_while_max_running_requests_run():
    s = make_scheduler(num_gpu_blocks=64, max_running_requests=2)
    a, b, c, d = make_group("a"), make_group("b", n=3), make_group("c"), make_group("d")
    add(s, a, b, c, d)
    assert ids(step(s).scheduled_seq_groups) == ["a", "b"]  # b's three sequences are one request
    assert ids(step(s).scheduled_seq_groups) == ["a", "b"] and ids(s.waiting) == ["c", "d"]
    finish(s, a)
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["c", "b"] and out.num_prefill_groups == 1
    assert ids(s.waiting) == ["d"]
    finish(s, b)
    finish(s, c)
    assert ids(step(s).scheduled_seq_groups) == ["d"]
    finish(s, d)
    assert_all_free(s)


def test_admission_under_the_token_budget():
    s = make_scheduler(num_gpu_blocks=64, max_num_batched_tokens=20)
    groups = [make_group(name, encoder_len=8, decoder_len=2) for name in "abcd"]  # 10 tokens each
    add(s, *groups)
    assert ids(step(s).scheduled_seq_groups) == ["a", "b"]
    out = step(s)  # two decode tokens leave 18
    assert ids(out.scheduled_seq_groups) == ["c", "a", "b"] and out.num_prefill_groups == 1
    assert ids(s.waiting) == ["d"]
    finish(s, groups[0])
    s.abort_seq_group("d")
    add(s, make_group("big", encoder_len=40, decoder_len=2))
    out = step(s)  # first prefill of its step: admitted over the budget, so it never stalls
    assert ids(out.scheduled_seq_groups) == ["big", "b", "c"]


def test_fcfs_head_that_does_not_fit_yet_blocks_smaller_groups():
    s = make_scheduler(num_gpu_blocks=6)
    add(s, make_group("a"))  # 2 blocks
    step(s)
    add(s, make_group("big", encoder_len=12), make_group("small"))  # 4 blocks, then 2
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["a"] and ids(s.waiting) == ["big", "small"]


def test_preempts_the_most_recently_admitted_group():
    s = make_scheduler(num_gpu_blocks=7)
    a, b, c = make_group("a"), make_group("b"), make_group("c")  # 1 cross + 1 full self block
    add(s, a, b, c)
    step(s)  # 6 blocks used; each 5th token needs a new block, 1 is free
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["a", "b"]
    assert ids(s.running) == ["a", "b"] and ids(s.waiting) == ["c"]
    assert s.stats.num_preemptions == s.stats.num_recomputes == 1


def test_swap_out_then_swap_in_in_admission_order():
    s = make_scheduler(num_gpu_blocks=9, num_cpu_blocks=32, preemption_mode="swap")
    groups = {name: make_group(name) for name in "abcd"}
    add(s, *groups.values())
    step(s)  # 8 blocks used, 1 free
    out = step(s)  # a takes the free block; d goes so that b and c get one
    assert ids(out.scheduled_seq_groups) == ["a", "b", "c"] and ids(s.swapped) == ["d"]
    assert len(out.blocks_to_swap_out) == 2
    assert all(seq.status == SequenceStatus.SWAPPED for seq in groups["d"].get_seqs())
    for _ in range(3):  # tokens 6 to 8 fit the second block; d cannot come back yet
        assert ids(step(s).scheduled_seq_groups) == ["a", "b", "c"]
    out = step(s)  # the 9th token: c goes for a and b
    assert ids(out.scheduled_seq_groups) == ["a", "b"] and ids(s.swapped) == ["c", "d"]
    add(s, make_group("late"))
    finish(s, groups["a"])
    finish(s, groups["b"])
    out = step(s)  # swapped groups first, then (none left swapped) the waiting one
    assert ids(s.running) == ["c", "d", "late"] and not s.swapped and not s.waiting
    assert ids(out.scheduled_seq_groups) == ["late", "c", "d"] and out.num_prefill_groups == 1
    assert len(out.blocks_to_swap_in) == 3 + 2
    assert s.stats.num_swap_outs == s.stats.num_swap_ins == 2 and s.stats.num_recomputes == 0


def test_no_prefill_while_a_group_is_swapped_out():
    """As vLLM: a swapped-out group comes back before any waiting group is admitted, even one
    that would fit now (later arrivals must not keep it out)."""
    s = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=16, preemption_mode="swap")
    a, b = make_group("a"), make_group("b")
    add(s, a, b)
    for _ in range(10):  # 1 cross block each; at 13 tokens each needs a 4th self block
        step(s)
    assert ids(s.swapped) == ["b"] and s.block_manager.get_num_free_gpu_blocks() == 3
    add(s, make_group("c", decoder_len=3))  # 1 cross + 1 self block: it would fit
    for _ in range(3):
        assert ids(step(s).scheduled_seq_groups) == ["a"] and ids(s.waiting) == ["c"]
    finish(s, a)
    step(s)
    assert ids(s.running) == ["b", "c"] and not s.swapped and not s.waiting


def test_recompute_frees_the_cross_table_and_readmits_the_whole_sequence():
    """A group preempted by recompute goes back to the head of the queue, ahead of those that
    came after it."""
    s = make_scheduler(num_gpu_blocks=5, preemption_mode="recompute")
    a, b = make_group("a"), make_group("b", encoder_len=8)
    add(s, a, b)
    step(s)  # 2 + 3 blocks
    add(s, make_group("c"))  # no room: it waits
    step(s)  # a's 5th token needs a block: b goes, cross table included
    bm = s.block_manager
    assert ids(s.waiting) == ["b", "c"] and b.request_id not in bm.cross_block_tables
    assert all(seq.seq_id not in bm.block_tables for seq in b.get_seqs())
    assert bm.get_num_free_gpu_blocks() == 5 - 3
    finish(s, a)
    metadata, out = s.schedule()
    (meta,) = metadata
    assert meta.request_id == "b" and meta.is_prompt and out.num_prefill_groups == 1
    assert len(meta.cross_block_table) == 2
    (seq_data,) = meta.seq_data.values()
    assert len(seq_data) == 5  # the prompt and the token sampled before preemption
    assert s.stats.num_recomputes == 1 and s.stats.num_swap_outs == 0


def test_a_group_that_alone_fills_the_cache_runs_without_preemption():
    s = make_scheduler(num_gpu_blocks=5)
    group = make_group("a", encoder_len=8, decoder_len=4)  # 2 cross blocks + up to 3 self blocks
    add(s, group)
    for _ in range(8):  # to 12 decoder tokens
        step(s)
    assert s.block_manager.get_num_free_gpu_blocks() == 0 and s.stats.num_preemptions == 0


def test_a_forked_group_that_alone_fills_the_cache_copies_its_shared_block_once():
    s = make_scheduler(num_gpu_blocks=4)
    group = make_group("a", encoder_len=8, decoder_len=2, n=2)  # 2 cross + 2 x 1 self blocks
    add(s, group)
    step(s)
    fork(s, group)  # both sequences write their 3rd token to the shared half-full block
    out = step(s)
    assert len(out.blocks_to_copy) == 1 and ids(out.scheduled_seq_groups) == ["a"]
    step(s)
    assert s.block_manager.get_num_free_gpu_blocks() == 0 and s.stats.num_preemptions == 0


def test_a_group_that_can_never_fit_is_ignored_and_does_not_stall():
    s = make_scheduler(num_gpu_blocks=4)
    add(s, make_group("huge", encoder_len=16), make_group("a"))  # 4 + 1 blocks > 4
    out = step(s)
    assert ids(out.ignored_seq_groups) == ["huge"] and ids(out.scheduled_seq_groups) == ["a"]
    (seq,) = out.ignored_seq_groups[0].get_seqs()
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED


def test_abort_waiting_running_and_swapped_groups_frees_every_block():
    s = make_scheduler(num_gpu_blocks=5, num_cpu_blocks=8, preemption_mode="swap")
    running, swapped, waiting = make_group("r"), make_group("s"), make_group("w")
    add(s, running, swapped)
    step(s)
    step(s)  # r takes the free block, s is swapped out
    add(s, waiting)
    assert (ids(s.running), ids(s.swapped), ids(s.waiting)) == (["r"], ["s"], ["w"])
    for group in (waiting, swapped, running):
        assert s.abort_seq_group(group.request_id)
        assert all(seq.status == SequenceStatus.FINISHED_ABORTED for seq in group.get_seqs())
    assert not s.abort_seq_group("r")
    assert not s.has_unfinished_seqs()
    assert_all_free(s)


def test_a_forked_group_without_swap_room_is_recomputed_whole():
    """No swap space for a forked group: it is preempted by recompute, both its sequences
    wait, and it comes back as one prefill of both, each with its own self table."""
    s = make_scheduler(num_gpu_blocks=7, num_cpu_blocks=0)
    a, b, c = make_group("a"), make_group("b"), make_group("c", decoder_len=2, n=2)
    add(s, a, b, c)
    step(s)  # 2 + 2 + 2 blocks
    fork(s, c)
    out = step(s)  # a takes the free block; b's needs c out, which cannot be swapped
    assert ids(out.scheduled_seq_groups) == ["a", "b"] and ids(s.waiting) == ["c"]
    assert all(seq.status == SequenceStatus.WAITING for seq in c.get_seqs())
    assert s.stats.num_recomputes == 1 and s.stats.num_swap_outs == 0
    finish(s, a)
    metadata, out = s.schedule()
    (meta,) = [m for m in metadata if m.request_id == "c"]
    assert meta.is_prompt and len(meta.seq_data) == 2 and len(set(map(tuple, meta.block_tables.values()))) == 2
    s.block_manager.check_invariants()
    for group in (b, c):
        assert s.abort_seq_group(group.request_id)
    assert_all_free(s)


def test_a_swapped_group_with_more_sequences_than_the_token_budget_comes_back():
    """Alone in its step it may pass max_num_batched_tokens, as a first prefill may; held to
    the budget it would stay swapped out forever, and the engine would step doing nothing."""
    s = make_scheduler(num_gpu_blocks=9, num_cpu_blocks=32, max_num_batched_tokens=2, preemption_mode="swap")
    a, b = make_group("a"), make_group("b", n=3)
    add(s, a, b)
    step(s)
    step(s)  # b is admitted in the second step, its first prefill
    fork(s, b)
    fork(s, b)
    while not s.swapped:
        step(s)
    assert ids(s.swapped) == ["b"] and b.num_seqs(SequenceStatus.SWAPPED) == 3
    finish(s, a)
    out = step(s)
    assert ids(out.scheduled_seq_groups) == ["b"] and not s.swapped and len(out.blocks_to_swap_in) > 0
    finish(s, b)
    assert_all_free(s)
