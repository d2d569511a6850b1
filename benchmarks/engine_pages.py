"""Paged caches whose block tables come from the engine's own block manager after earlier traffic: the pages a
decode kernel reads in a serving engine (benchmarks/attention.py, decode_bandwidth.py).

A benchmark's shuffled pages (any block anywhere) are the worst case of a cache whose blocks came back in any order;
the engine's BlockManager hands out runs of consecutive blocks (llm/engine/block_manager.py), which read faster.
"""

from __future__ import annotations

import itertools
import math
import random

import torch

from vlchat.llm.engine.block_manager import BlockManager, run_blocks_for
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams

PAGE = 16
POOL_SLACK = 1.25  # the block manager's pool against the blocks the measured sequences hold
CHURN_POOLS = 2  # the earlier traffic takes this many pools' worth of blocks


def allocator_tables(num_blocks: int, seqs: int, pages: int, run_blocks: int, seed: int = 0) -> list[list[int]]:
    """Block tables of `seqs` sequences of `pages` pages each as the engine's BlockManager (prefix caching on,
    `run_blocks` per run) hands them out from a pool of `num_blocks` after earlier traffic: sequences of random
    lengths (up to `pages`) arrive with a prompt of a random share of it, grow a page at a time together and
    finish, until CHURN_POOLS pools' worth of blocks were taken; then the row's sequences arrive (the oldest others
    finishing first where the row would not fit), each with a prompt of 1..pages pages, and grow together to
    `pages` while the other traffic goes on in the room the row leaves. Every token is new (no prefix hits), and
    every full block is hashed, so freed blocks are cached ones the manager evicts."""
    rng = random.Random(seed)
    bm = BlockManager(num_blocks, PAGE, True, run_blocks)
    ids = itertools.count()

    def grow(s: Sequence, new_pages: int) -> None:
        for _ in range(new_pages * PAGE):
            s.append_token(next(ids))
        bm.allocate(s, len(s))
        s.num_computed_tokens = len(s)
        bm.cache_full_blocks(s)

    def arrive(prompt_pages: int) -> Sequence:
        s = Sequence("bench", MultiModalPrompt([next(ids)]), SamplingParams(), PAGE)
        grow(s, prompt_pages)
        return s

    live, targets = [], {}

    def traffic(reserve: int) -> int:
        """One step of the other traffic, keeping `reserve` blocks free: arrivals, then a page for each of the
        others (or their finish); the blocks it took."""
        taken = 0
        while len(live) < max(4, seqs) and bm.num_free_blocks - reserve > pages:
            target = rng.randint(1, pages)
            live.append(arrive(rng.randint(1, target)))
            targets[id(live[-1])] = target
            taken += len(live[-1].block_table)
        for s in list(live):
            if len(s.block_table) >= targets[id(s)] or bm.num_free_blocks <= reserve:
                bm.free(s)
                live.remove(s)
            else:
                grow(s, 1)
                taken += 1
        return taken

    taken = 0
    while taken < CHURN_POOLS * num_blocks:
        taken += traffic(0)
    prompts = [rng.randint(1, pages) - 1 for _ in range(seqs)]
    while live and bm.num_free_blocks < seqs * pages:  # room for the row: the oldest others finish first
        bm.free(live.pop(0))
    row = [arrive(p) for p in prompts]
    for _ in range(pages):
        traffic(sum(pages - len(s.block_table) for s in row))
        for s in row:
            if len(s.block_table) < pages:
                grow(s, 1)
    return [s.block_table[:pages] for s in row]


def engine_pages(dtype, kv_heads: int, batch: int, ctx: int, sets: int, runs: bool = True, head_dim: int = 128):
    """(k_cache, v_cache, tables [sets, batch, ctx // PAGE] int32) on the GPU: `sets` L2-defeating copies of a batch
    of `batch` sequences of `ctx` tokens, their pages as the engine's block manager hands them out
    (`allocator_tables`; runs off: one block at a time from its free lists) from a pool POOL_SLACK times their
    blocks, the pool's K and V random."""
    pages = ctx // PAGE
    num_blocks = math.ceil(POOL_SLACK * sets * batch * pages)
    k_cache = torch.randn(num_blocks, PAGE, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    run_blocks = run_blocks_for(k_cache[0].nbytes) if runs else 1
    rows = allocator_tables(num_blocks, sets * batch, pages, run_blocks)
    tables = torch.tensor(rows, device="cuda", dtype=torch.int32).view(sets, batch, pages)
    return k_cache, v_cache, tables
