"""The order in which the prefill kernels (`prefill.py`, `prefill_ws.py`) take their query tiles.

Causal tiles near the end of a sequence see the most keys, so both kernels start from the last tile. Up to
HEADS_FIRST_MAX_TILES query tiles per head (all sequences), every head's tile m runs before any head's tile
m - 1; above it one head's tiles run together and stream the same K/V through the L2. The threshold was chosen by
benchmarks/attention.py; see docs/PERF.md#prefill.
"""

from __future__ import annotations

import triton
import triton.language as tl

HEADS_FIRST_MAX_TILES = 128


def grid(q_heads: int, batch: int, m_blocks: int) -> tuple[tuple[int, int, int], bool]:
    """(launch grid, heads first) for m_blocks query tiles per sequence; the program axes are read back by
    `program_tile`, the batch is always axis 1."""
    heads_first = m_blocks * batch <= HEADS_FIRST_MAX_TILES
    return ((q_heads, batch, m_blocks) if heads_first else (m_blocks, batch, q_heads)), heads_first


@triton.jit
def program_tile(HEADS_FIRST: tl.constexpr):
    """(query head, query tile) of this program, longest causal tiles first (a scalar helper: the Gluon kernel
    calls it too)."""
    if HEADS_FIRST:
        h = tl.program_id(0)
        m_blk = tl.num_programs(2) - 1 - tl.program_id(2)
    else:
        m_blk = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(2)
    return h, m_blk
