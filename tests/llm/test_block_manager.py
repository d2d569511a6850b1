"""Block manager: allocation, ref counts, prefix-cache hits (tokens and images), LRU eviction."""

from __future__ import annotations

import pytest

from llm.engine.block_manager import BlockManager
from llm.engine.sequence import Sequence
from llm.inputs import ImageItem, MultiModalPrompt
from llm.sampling_params import SamplingParams

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
