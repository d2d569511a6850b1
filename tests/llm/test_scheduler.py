"""Scheduler policy on plain sequences (no model): token budget, chunking, max_num_seqs, preemption."""

from __future__ import annotations

from collections import Counter

import pytest

from vlchat.llm.config import SchedulerConfig
from vlchat.llm.engine.block_manager import BlockManager
from vlchat.llm.engine.scheduler import Scheduler
from vlchat.llm.engine.sequence import Sequence, SequenceStatus
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams

BS = 4


def make(num_blocks=64, run_blocks=1, **cfg):
    return Scheduler(SchedulerConfig(**cfg), BlockManager(num_blocks, BS, run_blocks=run_blocks))


def seq(n, start=0):
    return Sequence("r", MultiModalPrompt(list(range(start, start + n))), SamplingParams(), BS)


def run_step(sched: Scheduler, token=1) -> list[Sequence]:
    """One engine step without a model: schedule, mark computed, append a token where a row samples."""
    return complete_step(sched, sched.schedule(), token)


def complete_step(sched: Scheduler, seqs: list[Sequence], token=1) -> list[Sequence]:
    """The rest of run_step for a step already scheduled (a test may look at it first)."""
    sampling = [s for s in seqs if s.samples_this_step]
    sched.update(seqs)
    for s in sampling:
        s.append_token(token)
    return seqs


def test_budget_chunks_a_long_prompt_and_mixes_decodes():
    sched = make(max_num_batched_tokens=8)
    short, long = seq(3), seq(20, start=100)
    sched.add(short)
    sched.add(long)
    first = run_step(sched)
    assert [s.num_computed_tokens for s in first] == [3, 5]  # 3 + 5 = budget; long is chunked
    assert short.num_output_tokens == 1 and long.num_output_tokens == 0
    second = sched.schedule()
    assert second == [short, long]
    assert short.num_new_tokens == 1 and long.num_new_tokens == 7  # decode first, then the next chunk
    assert not long.samples_this_step


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    sched = make(max_num_batched_tokens=8, enable_chunked_prefill=False)
    a, b = seq(6), seq(6, start=50)
    sched.add(a)
    sched.add(b)
    assert sched.schedule() == [a]


def test_max_num_seqs_caps_running_sequences():
    sched = make(max_num_seqs=2)
    seqs = [seq(3, start=10 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert run_step(sched) == seqs[:2]
    assert list(sched.waiting) == [seqs[2]]
    sched.finish(seqs[0])
    assert run_step(sched) == [seqs[1], seqs[2]]


def test_preemption_frees_the_newest_sequence_and_requeues_it_first():
    sched = make(num_blocks=4)
    a, b = seq(4), seq(4, start=50)  # one block each, full
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both prefilled; each got a token that needs a second block
    run_step(sched)  # a and b take blocks 3 and 4
    for _ in range(3):
        run_step(sched)  # fill the second blocks: len 8 each
    assert len(a) == 9 and sched.block_manager.num_free_blocks == 0
    scheduled = sched.schedule()  # a needs a third block: b is preempted
    assert scheduled == [a]
    assert b.status == SequenceStatus.WAITING and b.block_table == [] and sched.waiting[0] is b
    assert sched.num_preemptions == 1
    sched.update(scheduled)
    sched.finish(a)
    again = sched.schedule()  # b comes back with all of its tokens (prompt + output) to recompute
    assert again == [b] and b.num_new_tokens + b.num_computed_tokens == len(b) == 9
    assert b.num_computed_tokens > 0  # its own blocks, still cached, served part of the recompute
    assert b.num_cached_prompt_tokens == 0  # which the request's usage does not count as a cached prompt


def test_a_preempted_sequence_goes_ahead_of_waiting_ones_and_nothing_is_admitted_in_its_step():
    """c waits (max_num_seqs) when b is preempted: b goes to the queue's head, before c, and the step that
    preempted admits nobody, though it freed a block c would fit in (admitting then would thrash)."""
    sched = make(num_blocks=4, max_num_seqs=2)
    a, b, c = seq(4), seq(4, start=50), seq(4, start=90)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.add(c)
    for _ in range(4):
        assert c not in run_step(sched)
    assert len(a) == 9 and sched.block_manager.num_free_blocks == 0
    scheduled = sched.schedule()  # a needs a third block: b is preempted, freeing two
    assert scheduled == [a] and list(sched.waiting) == [b, c]
    assert sched.block_manager.num_free_blocks == 1 and len(sched.running) == 1  # room for c, yet not admitted


def test_single_sequence_preempts_itself_when_nothing_else_can_go():
    sched = make(num_blocks=2)
    a = seq(8)
    sched.add(a)
    run_step(sched)  # 8 tokens in 2 blocks + 1 sampled token needs a third
    assert sched.schedule() == []
    assert a.status == SequenceStatus.WAITING and sched.block_manager.num_free_blocks == 2


def test_prefix_cache_hit_skips_cached_tokens():
    sched = make()
    a = seq(10)
    sched.add(a)
    run_step(sched)
    b = seq(10)
    sched.add(b)
    sched.schedule()
    assert b.num_computed_tokens == 8 and b.num_new_tokens == 2 and b.num_cached_prompt_tokens == 8


def test_finish_releases_blocks_at_once():
    sched = make(num_blocks=8)
    a = seq(9)
    sched.add(a)
    run_step(sched)
    assert sched.block_manager.num_free_blocks == 5
    sched.finish(a)
    assert sched.block_manager.num_free_blocks == 8 and not sched.has_unfinished()


def check_invariants(sched: Scheduler) -> None:
    bm = sched.block_manager
    refs = [0] * bm.num_blocks
    for s in list(sched.running) + list(sched.waiting):
        for b in s.block_table:
            refs[b] += 1
    assert [b.ref_count for b in bm.blocks] == refs
    free = set(bm.free_plain) | set(bm.free_cached)
    assert len(free) == bm.num_free_blocks  # no block listed twice
    assert free == {i for i, r in enumerate(refs) if r == 0}
    assert all(bm.blocks[i].hash is not None for i in bm.free_cached)
    assert all(bm.hash_to_block[bm.blocks[i].hash] == i for i in range(bm.num_blocks) if bm.blocks[i].hash)
    for s in sched.running:
        assert len(s.block_table) * BS >= s.num_computed_tokens
    tails = Counter(s.block_table[-1] for s in list(sched.running) + list(sched.waiting) if s.block_table)
    assert bm.tails == dict(tails)
    runs = [b // bm.run_blocks for b in range(bm.num_blocks)]
    for r, size in enumerate(bm.run_sizes):
        assert bm.run_free[r] == sum(1 for b in free if runs[b] == r)
        assert bm.run_plain[r] == sum(1 for b in bm.free_plain if runs[b] == r)
        assert (r in bm.free_runs) == (bm.run_free[r] == size) and (r in bm.plain_runs) == (bm.run_plain[r] == size)


@pytest.mark.parametrize("run_blocks", [1, 4, 5])
def test_random_workload_keeps_block_accounting_exact(run_blocks):
    """Random arrivals (with shared prefixes), lengths, finishes and aborts against a small pool, with blocks
    taken one by one and in runs (5: a pool of 24 ends in a shorter run)."""
    import random

    rng = random.Random(0)
    sched = make(num_blocks=24, run_blocks=run_blocks, max_num_batched_tokens=16, max_num_seqs=6)
    live: list[Sequence] = []
    hits = 0
    for step in range(400):
        if rng.random() < 0.3 and len(live) < 10:
            prefix = [7] * rng.choice([0, 4, 8, 12])
            s = seq(rng.randint(1, 30), start=rng.randint(0, 3) * 100)
            s.token_ids = prefix + s.token_ids
            s.num_prompt_tokens = len(s.token_ids)
            s.max_tokens = rng.randint(1, 20)
            sched.add(s)
            live.append(s)
        hits += sum(1 for s in run_step(sched, token=step) if s.num_cached_prompt_tokens and s.num_output_tokens == 0)
        for s in list(live):
            if s.num_output_tokens >= s.max_tokens or (rng.random() < 0.02):
                sched.finish(s)
                live.remove(s)
        check_invariants(sched)
    for s in live:
        sched.finish(s)
    check_invariants(sched)
    assert sched.block_manager.num_free_blocks == 24 and sched.num_preemptions > 0 and hits > 0


def decoding(sched: Scheduler, n: int) -> list[Sequence]:
    """`n` sequences admitted and prefilled: every later step of theirs is a one-token decode."""
    seqs = [seq(3, start=10 * i) for i in range(n)]
    for s in seqs:
        sched.add(s)
    run_step(sched)
    return seqs


def test_prefill_hold_waits_for_company_then_admits_together():
    sched = make(max_num_batched_tokens=64, prefill_delay_steps=3, prefill_batch_tokens=10)
    decoding(sched, 2)
    late = seq(4, start=500)
    sched.add(late)
    assert late not in run_step(sched)  # decode-only step: the arrival waits
    other = seq(6, start=600)
    sched.add(other)  # 4 + 6 tokens reach prefill_batch_tokens: both go now, in one step
    step = run_step(sched)
    assert late in step and other in step


@pytest.mark.parametrize("arrivals", [False, True], ids=["alone", "a-prompt-each-step"])
def test_prefill_hold_never_waits_longer_than_the_delay(arrivals):
    """The delay counts from the oldest arrival: a prompt arriving every step does not keep the first waiting."""
    sched = make(max_num_batched_tokens=64, prefill_delay_steps=3, prefill_batch_tokens=100)
    decoding(sched, 2)
    late = seq(4, start=500)
    sched.add(late)
    waited = 0
    while late not in run_step(sched):
        if arrivals:
            sched.add(seq(4, start=600 + 10 * waited))
        waited += 1
    assert waited == 2  # admitted in the third step after it arrived


def test_running_sequences_past_the_token_budget_wait_for_the_next_step():
    """A chunked prompt that takes the whole budget leaves the sequence behind it for the next step: no sequence
    is scheduled with zero new tokens."""
    sched = make(max_num_batched_tokens=4)
    long, short = seq(12), seq(2, start=100)
    sched.add(long)
    sched.add(short)
    for _ in range(5):
        scheduled = sched.schedule()
        assert scheduled and all(s.num_new_tokens > 0 for s in scheduled), [s.num_new_tokens for s in scheduled]
        complete_step(sched, scheduled)


def test_prefill_hold_admits_at_once_with_nothing_decoding_or_a_prefill_in_the_step():
    sched = make(max_num_batched_tokens=16, prefill_delay_steps=3, prefill_batch_tokens=100)
    first = seq(3)
    sched.add(first)
    assert run_step(sched) == [first]  # nothing decoding: no reason to wait
    long = seq(20, start=100)
    sched.add(long)
    assert run_step(sched) == [first] and run_step(sched) == [first]  # held two steps, admitted in the third
    assert run_step(sched) == [first, long] and long.num_computed_tokens == 15  # first chunk
    follower = seq(2, start=400)
    sched.add(follower)
    assert run_step(sched) == [first, long, follower]  # the step prefills anyway: no hold


def test_prefill_hold_is_off_by_default_without_graphs():
    sched = make(max_num_batched_tokens=64)
    decoding(sched, 2)
    late = seq(4, start=500)
    sched.add(late)
    assert late in run_step(sched)


def test_a_token_in_flight_runs_ahead_unless_it_must_end_or_sampling_needs_history():
    sched = make(max_num_batched_tokens=64)
    plain = Sequence("a", MultiModalPrompt([5, 6, 7]), SamplingParams(max_tokens=8), BS)
    last = Sequence("b", MultiModalPrompt([5, 6, 7]), SamplingParams(max_tokens=1), BS)
    penalized = Sequence("c", MultiModalPrompt([5, 6, 7]), SamplingParams(max_tokens=8, repetition_penalty=1.2), BS)
    early = Sequence("d", MultiModalPrompt([5, 6, 7]), SamplingParams(max_tokens=8, min_tokens=2), BS)
    seqs = [plain, last, penalized, early]
    for s in seqs:
        sched.add(s)
    sched.update(sched.schedule())
    for s in seqs:
        s.num_pending = 1  # the prefill step's token is still on the device
    step = sched.schedule()
    assert step == [plain]  # max_tokens reached / penalties / min_tokens not yet reached: wait for the token
    assert plain.num_new_tokens == 1 and plain.samples_this_step and plain.num_computed_tokens == 3
    sched.update(step)
    assert plain.num_hashed_blocks == 0  # the block holding the in-flight token is not hashed before it arrives
    plain.append_token(9)
    assert plain.num_pending == 0 and len(plain) == 4
