"""The engine's pages a decode benchmark reads (GPU-free: the block manager's tables)."""

import pytest

from benchmarks.engine_pages import allocator_tables


@pytest.mark.parametrize("run_blocks", [1, 4])
def test_allocator_tables_are_the_block_managers_after_traffic(run_blocks):
    """Each sequence's table holds its own blocks of the pool; with runs of 4 they lie in whole aligned groups of 4
    (the row's 16 sequences grew together, a page at a time, among other traffic), from the free lists alone they
    are scattered."""
    tables = allocator_tables(num_blocks=640, seqs=16, pages=32, run_blocks=run_blocks)
    blocks = [b for t in tables for b in t]
    assert [len(t) for t in tables] == [32] * 16 and len(set(blocks)) == len(blocks) and max(blocks) < 640
    per_group = sum(len(t) / len({b // 4 for b in t}) for t in tables) / len(tables)
    assert per_group > 3.5 if run_blocks == 4 else per_group < 2.0
