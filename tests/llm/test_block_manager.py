"""Block manager: allocation, ref counts, prefix-cache hits (tokens and images), LRU eviction."""

from __future__ import annotations

import pytest

from vlchat.llm.engine.block_manager import BlockManager
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.inputs import ImageItem, MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams

BS = 4


def seq(tokens, images=()):
    return Sequence("r", MultiModalPrompt(list(tokens), images=list(images)), SamplingParams(), BS)


def computed(bm: BlockManager, s: Sequence, n: int | None = None) -> Sequence:
    """Allocate s for its whole length (reusing its cached prefix) and mark its K/V computed."""
    prefix = bm.match_prefix(s)
    bm.allocate(s, len(s) if n is None else n, prefix)
    s.num_computed_tokens = len(s) if n is None else n
    bm.cache_full_blocks(s)
    return s


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = computed(bm, seq(range(10)))  # 3 blocks
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(a)
    assert bm.num_free_blocks == 8 and a.block_table == []
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = computed(bm, seq(range(10)))  # blocks 0,1 full and hashed; block 2 partial
    b = seq(list(range(8)) + [50, 51, 52])
    prefix = bm.match_prefix(b)
    assert prefix == a.block_table[:2]
    assert bm.num_blocks_to_take(b, len(b), prefix) == 1  # shared blocks are in use: only the tail is new
    bm.allocate(b, len(b), prefix)
    assert b.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_prefix_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=BS)
    computed(bm, seq(range(8)))
    assert len(bm.match_prefix(seq(range(8)))) == 1  # 2 full blocks cached, but the last token must run
    assert len(bm.match_prefix(seq(range(9)))) == 2


def test_freed_cached_block_is_revived_and_counted_against_free_blocks():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = computed(bm, seq(range(9)))
    bm.free(a)
    b = seq(range(12))
    prefix = bm.match_prefix(b)
    assert len(prefix) == 2
    assert bm.num_blocks_to_take(b, 12, prefix) == 3  # 2 revived from the free list + 1 new
    bm.allocate(b, 12, prefix)
    assert bm.num_free_blocks == 1


def test_lru_eviction_drops_the_least_recently_freed_and_keeps_the_rest():
    bm = BlockManager(num_blocks=4, block_size=BS)
    old = computed(bm, seq([1] * 5))  # 1 full block hashed (+1 partial)
    new = computed(bm, seq([2] * 5))
    bm.free(old)
    bm.free(new)
    assert bm.num_free_blocks == 4
    filler = seq(range(100, 109))
    bm.allocate(filler, 9)  # 3 blocks: both plain ones, then evicts the oldest cached block
    assert bm.match_prefix(seq([1] * 5)) == []
    assert len(bm.match_prefix(seq([2] * 5))) == 1


def test_no_hit_across_different_images_with_equal_placeholder_tokens():
    bm = BlockManager(num_blocks=8, block_size=BS)
    img = lambda h: ImageItem(hash=h, data={}, offset=1, length=4)  # noqa: E731
    tokens = [7, 9, 9, 9, 9, 8, 8, 8, 8]
    computed(bm, seq(tokens, [img("cat")]))
    assert len(bm.match_prefix(seq(tokens, [img("cat")]))) == 2
    assert bm.match_prefix(seq(tokens, [img("dog")])) == []


def test_identical_blocks_computed_twice_keep_one_cache_entry():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = seq(range(5)), seq(range(5))
    bm.allocate(a, 5)
    bm.allocate(b, 5)  # both scheduled before either was computed: no hit
    for s in (a, b):
        s.num_computed_tokens = 5
        bm.cache_full_blocks(s)
    assert bm.blocks[a.block_table[0]].hash is not None and bm.blocks[b.block_table[0]].hash is None
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    computed(bm, seq(range(9)))
    assert bm.match_prefix(seq(range(9))) == []


def test_allocate_beyond_the_pool_is_refused():
    bm = BlockManager(num_blocks=2, block_size=BS)
    s = seq(range(9))
    assert not bm.can_allocate(s, 9)
    with pytest.raises(AssertionError):
        bm.allocate(s, 9)


def test_block_table_array_follows_appends_frees_and_prefix_reuse():
    # the runner's int32 copy of a table (Sequence.block_table_array) copies only new blocks; it must follow the
    # block manager through growth past its capacity, a free (a new empty list) and a prefix reuse (a new list)
    bm = BlockManager(num_blocks=64, block_size=BS)
    a = seq(range(3))
    for n in (3, 4, 5, 40, 41, 130):  # 1, 1, 2, 10, 11, 33 blocks: past the first capacity of 16
        bm.allocate(a, n)
        assert a.block_table_array().tolist() == a.block_table
    bm.free(a)
    assert a.block_table_array().tolist() == []
    b = computed(bm, seq(range(12)))
    c = seq(list(range(8)) + [90, 91])
    c.block_table_array()
    bm.allocate(c, len(c), bm.match_prefix(c))  # c's table is now a new list: b's first two blocks, then its own
    assert c.block_table_array().tolist() == c.block_table == b.block_table[:2] + c.block_table[2:]


def test_token_array_follows_appended_tokens_and_a_replaced_list():
    s = seq(range(5))
    assert s.token_array().tolist() == [0, 1, 2, 3, 4]
    for t in range(40):  # past the first capacity (16), then doubling
        s.append_token(100 + t)
        assert s.token_array().tolist() == s.token_ids
    s.token_ids = [7, 8] + s.token_ids  # a new list (as a test of the scheduler does): copied afresh
    assert s.token_array().tolist() == s.token_ids


def grow_together(bm: BlockManager, seqs: list[Sequence], blocks: int) -> None:
    """Each sequence takes `blocks` blocks one at a time, in turn (a decode batch crossing block boundaries)."""
    for n in range(1, blocks + 1):
        for s in seqs:
            bm.allocate(s, n * BS)


def blocks_per_stretch(table: list[int], size: int = 4) -> float:
    """A table's blocks per aligned group of `size` ids it touches (`size`: whole groups; 1: scattered)."""
    return len(table) / len({b // size for b in table})


@pytest.mark.parametrize("run_blocks", [1, 4])
def test_sequences_growing_together_take_whole_runs(run_blocks):
    bm = BlockManager(num_blocks=32, block_size=BS, run_blocks=run_blocks)
    seqs = [seq(range(1)) for _ in range(3)]
    grow_together(bm, seqs, 8)
    if run_blocks == 1:  # one at a time from the free list: interleaved
        assert seqs[0].block_table == list(range(0, 24, 3))
    else:  # each sequence in two whole runs of its own
        assert [s.block_table for s in seqs] == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 16, 17, 18, 19],
                                                 [8, 9, 10, 11, 20, 21, 22, 23]]  # fmt: skip


@pytest.mark.parametrize("run_blocks", [1, 4])
def test_runs_hold_under_churn_with_prefix_caching(run_blocks):
    """Sequences arrive (some sharing a prefix), grow a block at a time together and finish at random, long after
    every block has been used and cached once: with runs of 4 a table's own blocks (past a shared prefix) lie
    about 2.1-2.3 to an aligned group of 4 ids against 1.15 from the free lists alone."""
    import random

    rng = random.Random(1)
    bm = BlockManager(num_blocks=256, block_size=BS, run_blocks=run_blocks)
    live, shares, shared = [], [], {}
    for step in range(3000):
        if len(live) < 12 and rng.random() < 0.2:
            s = seq([5] * rng.choice([0, 8]) + [1000 + step] * rng.randint(1, 12))
            prefix = bm.match_prefix(s)
            if bm.can_allocate(s, len(s), prefix):
                bm.allocate(s, len(s), prefix)
                shared[id(s)] = len(prefix)  # reused blocks: where another sequence put them
                live.append(s)
        for s in list(live):
            s.append_token(step)
            if not bm.can_allocate(s, len(s)) or rng.random() < 0.01:
                bm.free(s)
                live.remove(s)
                continue
            bm.allocate(s, len(s))
            s.num_computed_tokens = len(s) - 1
            bm.cache_full_blocks(s)
            if step > 1000 and len(s.block_table) >= 8:
                shares.append(blocks_per_stretch(s.block_table[shared[id(s)] :]))
    assert len(bm.free_cached) > 10 * len(bm.free_plain)  # steady state: free blocks hold cached content
    mean = sum(shares) / len(shares)
    assert mean > 1.9 if run_blocks > 1 else mean < 1.3


def test_no_cached_block_is_evicted_while_never_hashed_blocks_are_free():
    bm = BlockManager(num_blocks=12, block_size=BS, run_blocks=4)
    a = computed(bm, seq(range(8)))  # blocks 0, 1: full and hashed
    b = seq(range(100, 101))
    bm.allocate(b, 1)
    assert b.block_table == [4]  # the next wholly never-hashed run
    bm.free(a)  # run 0: 0 and 1 cached, 2 and 3 never hashed
    c = seq(range(200, 201))
    bm.allocate(c, 1)
    assert c.block_table == [8]  # a wholly never-hashed run
    d = seq(range(300, 301))
    bm.allocate(d, 2 * BS)  # none is left: the longest never-hashed stretch no table continues into (2-3; 5 and 9
    assert d.block_table == [2, 3]  # continue b's and c's tables), not the wholly free run 0 over cached 0 and 1
    assert len(bm.match_prefix(seq(range(9)))) == 2


def test_once_every_free_block_is_cached_eviction_keeps_tables_in_runs_but_not_across_a_runs_edge():
    bm = BlockManager(num_blocks=8, block_size=BS, run_blocks=4)
    a = computed(bm, seq([1] * 16))  # 0-3, hashed
    b = computed(bm, seq([2] * 8))  # 4-5, hashed
    e1, e2 = seq(range(300, 301)), seq(range(400, 401))
    bm.allocate(e1, 1)  # 7: 6 would continue b's table
    bm.free(b)  # 5, then 4, cached: the least recently freed is 5
    bm.allocate(e2, 1)  # 6, never hashed, before any eviction
    assert (e1.block_table, e2.block_table) == ([7], [6]) and not bm.free_plain
    bm.allocate(a, 5 * BS)  # a's next id, 4, is the next run's first block: not taken, it may start another
    assert a.block_table[4] == 5  # request's cached prefix (b's here), which stays whole
    assert len(bm.match_prefix(seq([2] * 5))) == 1
    c = seq([9] * 16)
    bm.allocate(c, 1)  # free now: 4 alone, cached, evicted as the last resort
    assert c.block_table == [4] and bm.match_prefix(seq([2] * 5)) == []


def test_where_no_run_is_free_a_table_starts_the_longest_stretch_no_table_continues_into():
    bm = BlockManager(num_blocks=8, block_size=BS, run_blocks=4)
    x, y, z = (seq(range(i, i + 1)) for i in (100, 200, 300))
    bm.allocate(x, 2 * BS)  # 0, 1
    bm.allocate(y, 1)  # 4
    bm.allocate(z, 1)  # free: 2 (x's continuation), 3 (one free), 5 (y's), 6-7 (two free)
    assert z.block_table == [6]
    bm.allocate(x, 3 * BS)
    bm.allocate(y, 2 * BS)
    assert x.block_table == [0, 1, 2] and y.block_table == [4, 5]
    bm.free(x)  # its tail's claim goes: 2 no longer follows a table's last block
    assert bm.tails == {5: 1, 6: 1}
