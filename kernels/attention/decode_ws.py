"""Paged decode attention for sm_90 in Gluon: a TMA loader warp and one wgmma consumer warpgroup.

Used where it measured faster than the Triton kernel of `decode.py` (the sm_90 table's `decode_ws`,
`decode_ws_short`, `decode_ws_waves` and `decode_ws_long` in `configs.py`; `plan.decode_plan` says which config
takes which grid). The measurements behind the choices below are in docs/PERF.md#gluon-sm_90-decode.
One warp does nothing but issue loads:

- One CTA per (KV head, sequence, split), KV heads fastest (as `decode.py`). The loader looks up the pages of
  STAGES tiles of BLOCK_N keys at once in the block table (a lane per page), a group of tiles ahead, and issues
  one TMA box per page into a ring of STAGES K and V buffers
  (mbarriers `k_ready`/`v_ready`; `k_empty`/`v_empty` when the consumer is done with a stage's K / V: both
  after its PV product, or with the config's `early_k_release` K after its QK product, the loader then issuing
  the K tile without waiting for the V buffer). One lookup per group, not per tile, pays a dependent
  block-table read once per STAGES tiles. It loads the query group's rows once as a 3-D box of `query_columns` rows
  (the group padded to a power of two, at least 8): past the group come the next KV heads' query rows
  (computed, not stored), past the last head zeros.
- The consumer warpgroup computes with swapped operands, so that the tile's keys, not the few query heads, fill
  wgmma's M (64 rows at least): S^T = K Q^T ([BLOCK_N, group] in registers), the online softmax down its
  columns, then O^T += V^T P^T, V^T read transposed from the ring and P^T stored to shared memory. With the
  query heads as the rows (S = Q K^T, O += P V) a group of 4 would fill 4 of 64 rows and every tile's softmax
  work on 64 x BLOCK_N scores; swapped, it works on BLOCK_N x 8. The smaller query box also frees shared memory
  (`smem_bytes`).
- The online softmax keeps a stale running maximum: after a split's first tile the consumer computes a tile's
  probabilities against the running maximum, then the tile's maximum and the probabilities' sum in one reduction
  across the warps, and redoes them against a new maximum (rescaling the sum and O^T) only where the tile's
  maximum passes the running one by more than RESCALE_LOG2 (probabilities stay below 2^8): one reduction per
  tile instead of the exact step's two (the maximum, then the sum). A split's first tile takes the exact step.
- With the config's `pack_heads` P > 1 (the plan sets it: `splits.pack_heads`) one CTA reads P adjacent KV heads: a
  tile's BLOCK_N rows are BLOCK_N // P tokens x P heads, one TMA box [page, P, head_dim] per page (the P heads of a
  token are P * head_dim contiguous elements of the token-major cache), the query box holds the P heads' groups, and
  each query column's scores are masked to its own head's rows, so the products and the softmax are the unpacked
  ones. The grid is (KV heads // P, sequences, splits). On unsplit grids of several waves of short sequences, P
  fewer CTAs of P times the work pay the per-CTA start (the page lookup, the query, the first tile's round trip)
  once for P heads and make one wave.
- Splits and their merge are `decode.py`'s: each split divides the sequence's visible range
  [max(0, len - window), len) (aligned down to BLOCK_N) on the device and writes an fp32 partial and its
  log-sum-exp (base 2), or the output directly with one split; `decode._reduce_kernel` merges. With the config's
  `half_splits_keys` (`decode_ws_long`) a sequence whose range the first half of the splits would read in at most
  that many keys each is divided among those only: the split count, one of two, is chosen on the device per
  sequence (the other half's CTAs write empty partials), so a grid planned for a long context bound runs a short
  context on fewer, longer splits.
- With the config's `steal_tiles` T > 0 on a split grid of one KV head per CTA (`steals`; the plan keeps it where
  each split reads at least splits.STEAL_MIN_KEYS keys) the splits of a (sequence, KV head) share its range in
  units of T tiles instead of a fixed range each: split w takes unit w first, then the unit an atomic counter of
  the pair hands out (`num_splits + old value`), until none is left. The loader looks up a unit's pages while the
  previous unit streams and passes each unit to the consumer through a ring of keys in shared memory
  (`first tile << 6 | tiles`, -1 at the end); the consumer runs the same tile step over them. Each split still
  writes one partial of the keys it read, so the merge is unchanged. The last loader of a pair to finish sets its
  two counters (units handed out, loaders done) back to zero, so the buffer (`steal_counters`, kept in the
  caches' memo) is ready for the next call and for CUDA-graph replays without a memset. Why: the CTAs of a wave
  stream at unequal rates (CTAs alone on an SM ahead of paired ones), and a fixed split grid waits for its
  slowest; stolen units end close together. Shorter splits do not repay the counter's round trips, so the plan
  keeps fixed splits there.

With programmatic dependent launch (`pdl`) the loader loads the first group's pages and issues the split's first
tile, then waits for the previous kernel, then issues the query's and the other tiles' TMA loads (`decode.py` says
why). The first tile goes before the wait only where it ends before the sequence's last row: the kernel launched
before a decode may write, of the decoded sequences' rows, only each one's last (in a decode step the KV write
stores the step's new token there; the older rows were written in earlier steps, by kernels that ended before the
step's first kernel started; docs/INTERFACES.md states the rule for callers). Issuing more than the first tile
before the wait cost time.

The consumer lets the next kernel (the reduce, with splits) launch when it starts its split's last tile, where the
split has more than one (splits of one tile, and empty ones, let it launch at their end). The launch takes about
0.7 us, so the reduce's CTAs are in place, waiting, when the grid ends, and the next call's
decode CTAs, launched at the reduce's start, run their prologue (the page lookups) under it; this pays together
with the reduce's carveout preference (`carveout.py`). Launching the reduce earlier (a one-tile split at its start) cost time. With one split (no
reduce) the trigger lets whatever comes next launch: the next call's decode in the benchmarks, a GEMM launched
without dependent launch in the engine.

Rows of a tile past the sequence's end are loaded (the last page's stale rows: the engine's cache is
zero-initialised and only ever holds finite K/V) and masked to -inf before the softmax.

Scope (the sm_90 table's `decode_ws` and `available` decide when planning, `supports` at the call): sm_90,
fp16/bf16, head_dim 64/128/256 (the table's keys), tiles of a multiple of 64 keys, query groups of at most 64
heads (with packed heads: the P groups together, and whole pages in a tile, `packs`), pages of 16/32/64 tokens in
contiguous caches, no softcap. At head_dim 256 the fp32 accumulator O^T holds
256 rows: with 64 query columns the consumer spills about 200 bytes (compiled for sm_90, Triton 3.6; none up to 32
columns, where Gemma 3's groups of 2-4 are).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton

from vlchat.kernels.attention.gluon_sm90 import (
    LOG2E,
    TMA_PAGES,
    TensorDescriptor,
    fence_async_shared,
    gl,
    gluon,
    issue_page_boxes,
    kept,
    load_page_lanes,
    mbarrier,
    on_sm90,
    row_descriptor,
    shared_layout,
    tma,
    tma_rows_ok,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from vlchat.kernels.attention.pdl import gdc_launch_dependents, gdc_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

MAX_GROUP = 64  # query heads per KV head the kernel takes (its query columns, wgmma's N, go up to 64)
# the consumer keeps a stale running maximum while no score exceeds it by more than this (base 2): probabilities up
# to 2^8, well inside fp16's and bf16's range for P, the fp32 sums unaffected
RESCALE_LOG2 = gl.constexpr(8.0) if gluon is not None else 8.0
NO_WINDOW = 1 << 30


def available(device, group: int, page: int) -> bool:
    """Whether the kernel could serve decode calls of this model on `device` (what the split plan needs to know
    before any tensor exists): Gluon, an sm_90 GPU, a group of at most MAX_GROUP query columns, a supported
    page size."""
    return on_sm90(device) and group <= MAX_GROUP and page in TMA_PAGES


def supports(q, k_cache, v_cache, softcap) -> bool:
    """Whether this call can run here (else the Triton kernel runs it with the same split count): CUDA tensors,
    no softcap, unquantized contiguous caches (of q's dtype) and a query whose heads are TMA-readable rows."""
    if not on_sm90(device_for(q)) or (softcap and softcap > 0) or k_cache.dtype != q.dtype:
        return False
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and tma_rows_ok(k_cache) and tma_rows_ok(v_cache)):
        return False
    return tma_rows_ok(q)


if gluon is not None:

    @gluon.jit
    def _span(lens_ptr, b, split, num_splits, window, BLOCK_N: gl.constexpr, HALF_KEYS: gl.constexpr):
        """(first visible key, first key, end, tiles, sequence length) of this split: the visible range aligned down
        to BLOCK_N is divided into whole tiles among the splits; with HALF_KEYS (the config's half_splits_keys)
        among the first half of them where each would read at most HALF_KEYS keys there (the others are empty)."""
        seq_len = gl.load(lens_ptr + b)
        start = gl.maximum(seq_len - window, 0)
        base = start // BLOCK_N * BLOCK_N
        splits = num_splits
        if HALF_KEYS > 0:
            if gl.cdiv(seq_len - base, num_splits // 2) <= HALF_KEYS:
                splits = num_splits // 2
        chunk = gl.cdiv(gl.cdiv(seq_len - base, splits), BLOCK_N) * BLOCK_N
        lo = base + split * chunk
        hi = gl.minimum(lo + chunk, seq_len)
        return start, lo, hi, gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0), seq_len

    @gluon.jit
    def _issue(desc, pages, t, s, kvh, ready, smem, PAGE: gl.constexpr, PACK: gl.constexpr):
        """The TMA loads of tile t of the looked-up lanes of K or V into ring stage s: a box per page (boxes t * NBOX
        on; boxes past the split's end repeat its last page's rows, masked by the consumer). With PACK KV heads per CTA
        a box holds the page's rows of the CTA's PACK heads ([PAGE, PACK, HEAD_DIM]: tokens, then heads)."""
        if PACK == 1:
            BLOCK_N: gl.constexpr = smem.shape[1]
            HEAD_DIM: gl.constexpr = smem.shape[2]
            mbarrier.expect(ready.index(s), BLOCK_N * HEAD_DIM * smem.dtype.primitive_bitwidth // 8)
            issue_page_boxes(desc, pages, t * (BLOCK_N // PAGE), kvh * HEAD_DIM, ready.index(s), smem.index(s), PAGE)
        else:
            TOK: gl.constexpr = smem.shape[1]
            HEAD_DIM: gl.constexpr = smem.shape[3]
            mbarrier.expect(ready.index(s), TOK * PACK * HEAD_DIM * smem.dtype.primitive_bitwidth // 8)
            issue_page_boxes(desc, pages, t * (TOK // PAGE), kvh * PACK, ready.index(s), smem.index(s), PAGE, 3)

    @gluon.jit
    def _loader(q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, stride_tb, window, q_smem, k_smem, v_smem, bars,
                b, kvh, split, num_splits, GROUP: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, PAGE: gl.constexpr, LANES: gl.constexpr, PDL: gl.constexpr,
                HALF_KEYS: gl.constexpr, PACK: gl.constexpr):  # fmt: skip
        q_ready, k_ready, v_ready, k_empty, v_empty = bars
        TOK: gl.constexpr = BLOCK_N // PACK  # keys per tile (its rows: TOK tokens x PACK heads)
        _, lo, hi, n, seq_len = _span(lens_ptr, b, split, num_splits, window, TOK, HALF_KEYS)
        # a box per page: tiles start at multiples of TOK, which pages (16-64 tokens) divide
        gl.static_assert(TOK % PAGE == 0, "whole pages per tile")
        NBOX: gl.constexpr = TOK // PAGE
        last_page = (hi - 1) // PAGE
        table = tables_ptr + b.to(gl.int64) * stride_tb
        # the pages of STAGES tiles are looked up at once, a group ahead: each lookup is a dependent global load
        # (a DRAM round trip where the table is not in L2), paid once per group instead of once per tile. The block
        # table is the engine's input, not the previous kernel's output: the first group's pages load before the
        # wait for that kernel (q and the cache's new rows are its output)
        GROUP_KEYS: gl.constexpr = STAGES * TOK
        gl.static_assert(LANES >= STAGES * NBOX, "a lane per box of the group")
        pages = load_page_lanes(table, lo // PAGE, last_page, n > 0, LANES)
        # the split's first tile, where it ends before the sequence's last row, loads before the wait too: the kernel
        # before a decode writes of its sequences' rows only the last (the step's new token; the module docstring)
        early = (n > 0) & (lo + TOK < seq_len) & PDL
        if early:
            _issue(kc_desc, pages, 0, 0, kvh, k_ready, k_smem, PAGE, PACK)
            _issue(vc_desc, pages, 0, 0, kvh, v_ready, v_smem, PAGE, PACK)
        if PDL:
            gdc_wait()
        mbarrier.expect(q_ready.index(0), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, kvh * PACK * GROUP, 0], q_ready.index(0), q_smem)
        for g in range(gl.cdiv(n, STAGES)):
            key0 = lo + (g + 1) * GROUP_KEYS
            following = load_page_lanes(table, key0 // PAGE, last_page, (g + 1) * STAGES < n, LANES)
            for s in gl.static_range(STAGES):
                j = g * STAGES + s
                if (j < n) & ((j > 0) | (not early)):
                    # K as soon as its buffer is free, V once its own is (without the early K release the consumer
                    # frees both at once)
                    mbarrier.wait(k_empty.index(s), (g & 1) ^ 1)
                    _issue(kc_desc, pages, s, s, kvh, k_ready, k_smem, PAGE, PACK)
                    mbarrier.wait(v_empty.index(s), (g & 1) ^ 1)
                    _issue(vc_desc, pages, s, s, kvh, v_ready, v_smem, PAGE, PACK)
            pages = following

    @gluon.jit
    def _put_unit(key_smem, s, value):
        """The loader's word in the key ring's stage s (all its lanes store it; the K tile's mbarrier.expect, by lane
        0 after a warp sync, releases it to the consumer)."""
        key_smem.index(s).store(gl.full([1], value, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))

    @gluon.jit
    def _read_key(key_smem, s):
        """The consumer's read of the key ring's stage s (its K tile waited for)."""
        return gl.max(key_smem.index(s).load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)

    @gluon.jit
    def _lane0_add(ptr):
        """atomic_add(ptr, 1) by lane 0 of the loader warp; the old value, on every lane."""
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        lanes = gl.arange(0, 32, layout=lay)
        old = gl.atomic_add(ptr + lanes * 0, gl.full([32], 1, gl.int32, lay), mask=lanes == 0)
        return gl.max(gl.where(lanes == 0, old, -1), axis=0)

    @gluon.jit
    def _stealing_loader(q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, counters_ptr, stride_tb, window, q_smem,
                         k_smem, v_smem, key_smem, bars, b, kvh, split, num_splits, GROUP: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE: gl.constexpr, LANES: gl.constexpr,
                         PDL: gl.constexpr, STEAL: gl.constexpr):  # fmt: skip
        """The loader with tile stealing (the module docstring): the splits of a (sequence, KV head) divide its visible
        range into units of STEAL tiles; split w takes unit w, then whichever unit the pair's counter hands out next,
        until none is left. Each unit's first tile carries (its first tile's index << 6) | its tiles in the key ring;
        the last word is -1. The last of the pair's loaders to run out sets its two counters back to 0."""
        q_ready, k_ready, v_ready, k_empty, v_empty = bars
        UNIT_KEYS: gl.constexpr = STEAL * BLOCK_N
        gl.static_assert(LANES >= STEAL * (BLOCK_N // PAGE), "a lane per box of a unit")
        gl.static_assert(STEAL < 64, "a unit's tile count takes the key word's low 6 bits")
        seq_len = gl.load(lens_ptr + b)
        base = gl.maximum(seq_len - window, 0) // BLOCK_N * BLOCK_N
        units = gl.cdiv(seq_len - base, UNIT_KEYS)
        last_page = (seq_len - 1) // PAGE
        table = tables_ptr + b.to(gl.int64) * stride_tb
        counter = counters_ptr + (b * gl.num_programs(0) + kvh) * 2  # [units handed out, loaders done]
        unit = split
        pages = load_page_lanes(table, (base + unit * UNIT_KEYS) // PAGE, last_page, unit < units, LANES)
        # the first unit's first tile before the wait, as the static loader's (the counter is read after it: the
        # previous call on these counters has ended by then)
        early = (unit < units) & (base + unit * UNIT_KEYS + BLOCK_N < seq_len) & PDL
        if early:
            first = base // BLOCK_N + unit * STEAL
            _put_unit(key_smem, 0, (first << 6) | gl.minimum(STEAL, gl.cdiv(seq_len, BLOCK_N) - first))
            _issue(kc_desc, pages, 0, 0, kvh, k_ready, k_smem, PAGE, 1)
            _issue(vc_desc, pages, 0, 0, kvh, v_ready, v_smem, PAGE, 1)
        if PDL:
            gdc_wait()
        mbarrier.expect(q_ready.index(0), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, kvh * GROUP, 0], q_ready.index(0), q_smem)
        j = 0
        while unit < units:
            following_unit = num_splits + _lane0_add(counter)  # the next unit, and its pages, a unit ahead
            following = load_page_lanes(
                table, (base + following_unit * UNIT_KEYS) // PAGE, last_page, following_unit < units, LANES
            )
            first = base // BLOCK_N + unit * STEAL
            tiles = gl.minimum(STEAL, gl.cdiv(seq_len, BLOCK_N) - first)
            for t in gl.static_range(STEAL):
                if t < tiles:
                    s = j % STAGES
                    phase = (j // STAGES) & 1
                    if (j > 0) | (not early):
                        mbarrier.wait(k_empty.index(s), phase ^ 1)
                        if t == 0:
                            _put_unit(key_smem, s, (first << 6) | tiles)
                        _issue(kc_desc, pages, t, s, kvh, k_ready, k_smem, PAGE, 1)
                        mbarrier.wait(v_empty.index(s), phase ^ 1)
                        _issue(vc_desc, pages, t, s, kvh, v_ready, v_smem, PAGE, 1)
                    j += 1
            unit = following_unit
            pages = following
        s = j % STAGES
        mbarrier.wait(k_empty.index(s), ((j // STAGES) & 1) ^ 1)
        _put_unit(key_smem, s, -1)
        mbarrier.arrive(k_ready.index(s), count=1)
        if _lane0_add(counter + 1) == num_splits - 1:  # every loader of the pair has run out
            lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
            lanes = gl.arange(0, 32, layout=lay)
            gl.store(counter + lanes, gl.zeros([32], gl.int32, lay), mask=lanes < 2)

    @gluon.jit
    def _max_and_sum(t_a, p_a, t_b, p_b):
        return gl.maximum(t_a, t_b), p_a + p_b

    @gluon.jit
    def _rescaled(t, t_max, m_i, l_i, acc):
        """The online softmax's exact step for scores t (base 2, scaled) whose maximum is t_max: the tile's
        probabilities against the new running maximum, and that maximum, the sum and the accumulator rescaled to it."""
        m_new = gl.maximum(m_i, t_max)
        p = gl.exp2(t - m_new[None, :])
        alpha = gl.exp2(m_i - m_new)
        return p, m_new, l_i * alpha + gl.sum(p, axis=0), acc * alpha[None, :]

    @gluon.jit
    def _tile_step(k_smem, v_smem, p_smem, q_t, p_t, zero, bars, s, phase, first_tile, key0, start, hi, m_i, l_i, acc,
                   qk_scale, layout: gl.constexpr, GROUP: gl.constexpr, EARLY_K: gl.constexpr,
                   PACK: gl.constexpr):  # fmt: skip
        """One tile of the consumer, its K in ring stage s (waited for): S^T = K Q^T, the online softmax, O^T += V^T P^T
        (waiting for V), the stage's buffers released; the running maximum, sum and O^T after it."""
        _, _, v_ready, k_empty, v_empty = bars
        BLOCK_N: gl.constexpr = zero.shape[0]
        NQ: gl.constexpr = zero.shape[1]
        TOK: gl.constexpr = BLOCK_N // PACK
        sc = warpgroup_mma(_tile(k_smem, s, PACK), q_t, zero, use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(0, deps=(sc,))
        if EARLY_K:  # K is read by the QK product only
            mbarrier.arrive(k_empty.index(s), count=1)
        if (key0 < start) | (key0 + TOK > hi):  # a window's first tile or the range's last
            keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout)) // PACK
            sc = gl.where(((keys >= start) & (keys < hi))[:, None], sc, float("-inf"))
        if PACK > 1:  # a column sees its own head's rows only (row r holds head r % PACK; the columns past
            # the heads' groups, not stored, see every row: no column without a visible key)
            rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
            cols = gl.arange(0, NQ, layout=gl.SliceLayout(0, layout))
            own = ((rows % PACK)[:, None] == (cols // GROUP)[None, :]) | (cols >= GROUP * PACK)[None, :]
            sc = gl.where(own, sc, float("-inf"))
        t = sc * qk_scale
        if first_tile:  # t's maximum is finite: every tile holds a visible key
            p, m_i, l_i, acc = _rescaled(t, gl.max(t, axis=0), m_i, l_i, acc)
        else:
            # the probabilities against the running maximum, then the tile's maximum and their sum in one
            # reduction across the warps; redone against a new maximum only where the tile's passes the running
            # one by more than RESCALE_LOG2 (rarely)
            p = gl.exp2(t - m_i[None, :])
            t_max, p_sum = gl.reduce((t, p), 0, _max_and_sum)
            if gl.max(t_max - m_i, axis=0) > RESCALE_LOG2:
                p, m_i, l_i, acc = _rescaled(t, t_max, m_i, l_i, acc)
            else:
                l_i = l_i + p_sum
        # P^T goes through shared memory (wgmma's B); the previous tile's product has completed (waited below)
        p_smem.store(gl.permute(p.to(p_smem.dtype), (1, 0)))
        fence_async_shared()
        mbarrier.wait(v_ready.index(s), phase)
        acc = warpgroup_mma(_tile(v_smem, s, PACK).permute((1, 0)), p_t, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        if not EARLY_K:
            mbarrier.arrive(k_empty.index(s), count=1)
        mbarrier.arrive(v_empty.index(s), count=1)
        return m_i, l_i, acc

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, p_smem, key_smem, bars, lens_ptr, out_ptr, part_ptr, lse_ptr, qk_scale,
                  window, b, kvh, split, num_splits, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                  Q_HEADS: gl.constexpr, GROUP: gl.constexpr, NQ: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DIRECT: gl.constexpr, PDL: gl.constexpr,
                  EARLY_K: gl.constexpr, HALF_KEYS: gl.constexpr, PACK: gl.constexpr, STEAL: gl.constexpr):  # fmt: skip
        q_ready, k_ready = bars[0], bars[1]
        gl.static_assert((BLOCK_N % 64 == 0) & (HEAD_DIM % 64 == 0), "keys and head_dim are wgmma's M: 64s")
        # S^T [BLOCK_N, NQ] and O^T [HEAD_DIM, NQ]: keys and head_dim are the rows, the query group the columns
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NQ, 16])
        TOK: gl.constexpr = BLOCK_N // PACK
        start, lo, hi, n, seq_len = _span(lens_ptr, b, split, num_splits, window, TOK, HALF_KEYS)
        m_i = gl.full([NQ], float("-inf"), gl.float32, gl.SliceLayout(0, layout))
        l_i = gl.zeros([NQ], gl.float32, gl.SliceLayout(0, layout))
        acc = gl.zeros([HEAD_DIM, NQ], gl.float32, layout)
        zero = gl.zeros([BLOCK_N, NQ], gl.float32, layout)
        q_t = q_smem.reshape([NQ, HEAD_DIM]).permute((1, 0))
        p_t = p_smem.permute((1, 0))
        mbarrier.wait(q_ready.index(0), 0)
        if STEAL > 0:
            # units of STEAL tiles as the loader takes them (its key ring says where each starts and how many tiles
            # it has; -1 when it has no more); the next kernel may launch once this CTA reads in the range's last
            # units, where every split's last unit lies
            tail = seq_len - num_splits * STEAL * TOK
            j = 0
            mbarrier.wait(k_ready.index(0), 0)
            unit = _read_key(key_smem, 0)
            while unit >= 0:
                first = (unit >> 6) * TOK
                for t in range(unit & 63):
                    s = j % STAGES
                    phase = (j // STAGES) & 1
                    key0 = first + t * TOK
                    if t > 0:
                        mbarrier.wait(k_ready.index(s), phase)
                    if PDL:
                        if key0 >= tail:
                            gdc_launch_dependents()
                    m_i, l_i, acc = _tile_step(k_smem, v_smem, p_smem, q_t, p_t, zero, bars, s, phase, j == 0, key0,
                                               start, seq_len, m_i, l_i, acc, qk_scale, layout, GROUP, EARLY_K,
                                               PACK)  # fmt: skip
                    j += 1
                mbarrier.wait(k_ready.index(j % STAGES), (j // STAGES) & 1)
                unit = _read_key(key_smem, j % STAGES)
        else:
            for j in range(n):
                s = j % STAGES
                phase = (j // STAGES) & 1
                mbarrier.wait(k_ready.index(s), phase)
                if PDL:
                    if (j == n - 1) & (j > 0):  # the next kernel may launch now (the module docstring says why here)
                        gdc_launch_dependents()
                m_i, l_i, acc = _tile_step(k_smem, v_smem, p_smem, q_t, p_t, zero, bars, s, phase, j == 0,
                                           lo + j * TOK, start, hi, m_i, l_i, acc, qk_scale, layout, GROUP, EARLY_K,
                                           PACK)  # fmt: skip
        o = acc / gl.where(l_i > 0, l_i, 1.0)[None, :]  # no visible key: zeros
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, NQ, layout=gl.SliceLayout(0, layout))
        heads = kvh * PACK * GROUP + cols
        ok = (cols < GROUP * PACK)[None, :] & (dims >= 0)[:, None]
        if DIRECT:
            ptrs = out_ptr + (b * stride_ob + heads * stride_oh)[None, :] + dims[:, None]
            gl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=ok)
        else:
            ptrs = part_ptr + (b * stride_pb + heads * stride_ph + split * stride_ps)[None, :] + dims[:, None]
            gl.store(ptrs, o, mask=ok)
            lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))
            gl.store(lse_ptr + (b * Q_HEADS + heads) * num_splits + split, lse, mask=cols < GROUP * PACK)

    @gluon.jit
    def _tile(smem, s, PACK: gl.constexpr):
        """Ring stage s as wgmma's [BLOCK_N, HEAD_DIM] operand (with PACK heads: its [TOK, PACK, HEAD_DIM] box rows
        viewed as TOK * PACK rows, no data moved)."""
        if PACK == 1:
            return smem.index(s)
        else:
            return smem.index(s).reshape([smem.shape[1] * PACK, smem.shape[3]])

    @gluon.jit
    def ring_buffers(q_desc, kc_desc, vc_desc, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     PACK: gl.constexpr = 1):  # fmt: skip
        """The shared memory the loader fills: the query box and the K and V rings of STAGES tiles (with PACK heads
        per CTA, tiles of [BLOCK_N // PACK tokens, PACK heads, HEAD_DIM], the boxes' shape)."""
        q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
        if PACK == 1:
            shape: gl.constexpr = [STAGES, BLOCK_N, HEAD_DIM]
        else:
            shape: gl.constexpr = [STAGES, BLOCK_N // PACK, PACK, HEAD_DIM]
        k_smem = gl.allocate_shared_memory(kc_desc.dtype, shape, kc_desc.layout)
        v_smem = gl.allocate_shared_memory(vc_desc.dtype, shape, vc_desc.layout)
        return q_smem, k_smem, v_smem

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr):
        """The mbarriers of the query box and the K/V ring, initialised: (q_ready, k_ready, v_ready, k_empty,
        v_empty), the loader's and the consumer's `bars`. (Every barrier stays in use to the end: on the H200 a
        variant that initialised one it never used again gave wrong rows, its memory shared with the softmax's
        reduction scratch.)"""
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready.index(0), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=1)
        return q_ready, k_ready, v_ready, k_empty, v_empty

    @gluon.jit
    def _ws_decode_kernel(q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr, counters_ptr,
                          qk_scale, window, num_splits, stride_tb, stride_ob, stride_oh, stride_pb, stride_ph,
                          stride_ps,
                          Q_HEADS: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, PAGE: gl.constexpr, LANES: gl.constexpr, DIRECT: gl.constexpr,
                          PDL: gl.constexpr, EARLY_K: gl.constexpr, HALF_KEYS: gl.constexpr,
                          PACK: gl.constexpr, STEAL: gl.constexpr):  # fmt: skip
        NQ: gl.constexpr = q_desc.block_type.shape[1]  # the query groups padded to wgmma's N (query_columns)
        kvh = gl.program_id(0)  # the CTA's first KV head is kvh * PACK
        b = gl.program_id(1)
        split = gl.program_id(2)
        q_smem, k_smem, v_smem = ring_buffers(q_desc, kc_desc, vc_desc, STAGES, BLOCK_N, HEAD_DIM, PACK)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NQ, BLOCK_N], kc_desc.dtype)
        p_smem = gl.allocate_shared_memory(kc_desc.dtype, [NQ, BLOCK_N], p_layout)
        # with STEAL: the ring's key words (a unit's first tile and tile count, from the loader to the consumer)
        key_smem = gl.allocate_shared_memory(gl.int32, [STAGES, 1], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        bars = ring_barriers(STAGES)
        if STEAL > 0:
            gl.static_assert((PACK == 1) & (HALF_KEYS == 0), "tile stealing takes one KV head per CTA, no halving")
            gl.warp_specialize([  # (a partition's function and arguments must be written out in the call)
                (_consumer, (q_smem, k_smem, v_smem, p_smem, key_smem, bars, lens_ptr, out_ptr, part_ptr, lse_ptr,
                             qk_scale, window, b, kvh, split, num_splits, stride_ob, stride_oh, stride_pb, stride_ph,
                             stride_ps, Q_HEADS, GROUP, NQ, HEAD_DIM, BLOCK_N, STAGES, DIRECT, PDL, EARLY_K, HALF_KEYS,
                             PACK, STEAL)),
                (_stealing_loader, (q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, counters_ptr, stride_tb, window,
                                    q_smem, k_smem, v_smem, key_smem, bars, b, kvh, split, num_splits, GROUP, BLOCK_N,
                                    STAGES, PAGE, LANES, PDL, STEAL)),
            ], [1], [24])  # fmt: skip
        else:
            gl.warp_specialize([  # (a partition's function and arguments must be written out in the call)
                (_consumer, (q_smem, k_smem, v_smem, p_smem, key_smem, bars, lens_ptr, out_ptr, part_ptr, lse_ptr,
                             qk_scale, window, b, kvh, split, num_splits, stride_ob, stride_oh, stride_pb, stride_ph,
                             stride_ps, Q_HEADS, GROUP, NQ, HEAD_DIM, BLOCK_N, STAGES, DIRECT, PDL, EARLY_K, HALF_KEYS,
                             PACK, STEAL)),
                (_loader, (q_desc, kc_desc, vc_desc, tables_ptr, lens_ptr, stride_tb, window, q_smem, k_smem, v_smem,
                           bars, b, kvh, split, num_splits, GROUP, BLOCK_N, STAGES, PAGE, LANES, PDL, HALF_KEYS, PACK)),
            ], [1], [24])  # fmt: skip


def launch_options(config) -> dict:
    """One consumer warpgroup plus the loader warp, which Triton pads to a second warpgroup: 256 threads x the
    config's registers per thread (128: two CTAs fit per SM; above, one)."""
    return dict(num_warps=4, maxnreg=config.registers)


def query_columns(group: int) -> int:
    """The query group padded to wgmma's N: a power of two, at least 8."""
    return max(8, triton.next_power_of_2(group))


def smem_bytes(config, head_dim: int, elem_size: int, group: int) -> int:
    """Shared memory of one CTA: the K and V rings, the query box, P^T, the mbarriers and the key words (the compiler
    adds 0.2-1 KB of scratch for the softmax's reductions across warps)."""
    ring = 2 * config.num_stages * config.block_n * head_dim * elem_size
    columns = query_columns(group * config.pack_heads)
    barriers, keys = 8 * (4 * config.num_stages + 1), 4 * config.num_stages
    return ring + columns * (head_dim + config.block_n) * elem_size + barriers + keys


def page_lanes(config, page: int) -> int:
    """Lanes of the loader's page lookup: one per box of a group of STAGES tiles (with tile stealing, of a unit of
    steal_tiles tiles where that is more), to a power of two."""
    boxes = max(1, config.block_n // config.pack_heads // page)
    return triton.next_power_of_2(max(config.num_stages, config.steal_tiles) * boxes)


def steals(config, num_splits: int) -> int:
    """Tiles per unit of the call's tile stealing, 0 for none: the config's steal_tiles on a split grid of one KV
    head per CTA."""
    return config.steal_tiles if num_splits > 1 and config.pack_heads == 1 else 0


STEAL_MAX_UNITS = 4096  # (sequence, KV head) pairs a kept counter buffer covers (32 KB); beyond, no stealing


def steal_counters(device, units: int, memo: dict | None):
    """The stealing counters of a call over `units` (sequence, KV head) pairs, two int32 each, zero (each call's
    last loader of a pair sets its pair back to zero), or None: more than STEAL_MAX_UNITS pairs, or a memo without
    counters yet while a CUDA graph is being captured (memory allocated there belongs to the graph; the engine's
    warm-up before each capture allocates them). Kept in `memo` (the caches' owner: its calls run one after the
    other on one stream, so no two share the counters at once); without one, fresh zeros per call."""
    if units > STEAL_MAX_UNITS:
        return None
    if memo is None:
        return torch.zeros(2 * units, dtype=torch.int32, device=device)
    counters = memo.get("steal_counters")
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = memo["steal_counters"] = torch.zeros(2 * STEAL_MAX_UNITS, dtype=torch.int32, device=device)
    return counters


def descriptors(q, k_cache, v_cache, block_n: int, pack: int = 1, cache_memo: dict | None = None):
    """TMA descriptors of the query (a 3-D box of query_columns rows per (sequence, CTA's KV heads)) and of the
    caches' rows (one box per page: [page, head_dim] of the [tokens, heads * head_dim] view, or with `pack` KV heads
    per CTA [page, pack, head_dim] of the [tokens, heads, head_dim] view); the caches' kept in `cache_memo`
    (gluon_sm90.row_descriptor)."""
    head_dim, page, kv_heads = q.shape[-1], k_cache.shape[1], k_cache.shape[2]
    columns = query_columns(q.shape[1] // kv_heads * pack)
    q_layout = shared_layout((1, columns, head_dim), q.dtype)
    q_desc = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, columns, head_dim], q_layout)
    if pack == 1:
        kv_layout = shared_layout((block_n, head_dim), q.dtype)
        kc = row_descriptor(k_cache, page, kv_layout, cache_memo)
        return q_desc, kc, row_descriptor(v_cache, page, kv_layout, cache_memo)
    box = [page, pack, head_dim]
    kv_layout = shared_layout(tuple(box), q.dtype)

    def heads_view(t):
        def build():
            shape = [t.numel() // (kv_heads * head_dim), kv_heads, head_dim]
            return TensorDescriptor(t, shape, [t.stride(-3), t.stride(-2), 1], box, kv_layout)

        return kept(cache_memo, t, (tuple(box), kv_layout), build)

    return q_desc, heads_view(k_cache), heads_view(v_cache)


def packs(config, group: int, kv_heads: int, page: int, pack: int) -> bool:
    """Whether the kernel can take `pack` KV heads per CTA with this config: a divisor of kv_heads, the heads' query
    groups within MAX_GROUP columns, and whole pages in a tile's BLOCK_N // pack keys."""
    keys = config.block_n // pack
    return kv_heads % pack == 0 and group * pack <= MAX_GROUP and keys >= page and keys % page == 0


def constexprs(q_heads: int, kv_heads: int, head_dim: int, page: int, config, num_splits: int, pdl: bool) -> dict:
    """The kernel's compile-time arguments for a call (launch; tests/kernels/sm90_ptx.py compiles with them)."""
    return dict(
        Q_HEADS=q_heads, GROUP=q_heads // kv_heads, HEAD_DIM=head_dim, BLOCK_N=config.block_n,
        STAGES=config.num_stages, PAGE=page, LANES=page_lanes(config, page), DIRECT=num_splits == 1, PDL=pdl,
        EARLY_K=config.early_k_release, STEAL=steals(config, num_splits),
        HALF_KEYS=config.half_splits_keys if num_splits > 1 and not steals(config, num_splits) else 0,
        PACK=config.pack_heads,
    )  # fmt: skip


def launch(
    q, k_cache, v_cache, block_tables, seq_lens, scale, window, num_splits, out, part, lse, config, pdl=False,
    cache_memo=None,
):  # fmt: skip
    """Run the kernel (`supports` must hold): the output directly with one split, else the partials and their
    log-sum-exps for `decode._reduce_kernel`. `cache_memo`: `descriptors`, and where the call steals tiles
    (`steals`) `steal_counters` (with none to be had there, the call runs fixed splits)."""
    batch, q_heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    pack = config.pack_heads
    if not packs(config, q_heads // kv_heads, kv_heads, page, pack):
        raise ValueError(
            f"decode_ws config {config} cannot take {pack} KV heads per CTA here: {kv_heads} KV heads, query groups "
            f"of {q_heads // kv_heads}, pages of {page} tokens (packs() says what it needs)"
        )
    q_desc, kc_desc, vc_desc = descriptors(q, k_cache, v_cache, config.block_n, pack, cache_memo)
    part_strides = (0, 0, 0) if num_splits == 1 else part.stride()[:3]
    counters = seq_lens  # not read without stealing
    if steals(config, num_splits):
        counters = steal_counters(q.device, batch * kv_heads, cache_memo)
        if counters is None:  # none to be had here (steal_counters says when): fixed splits
            config, counters = replace(config, steal_tiles=0), seq_lens
    launch_compiled(_ws_decode_kernel, (kv_heads // pack, batch, num_splits),
        q_desc, kc_desc, vc_desc, block_tables, seq_lens, out, part, lse, counters, float(scale) * LOG2E,
        int(window) if window and window > 0 else NO_WINDOW, num_splits, block_tables.stride(0), out.stride(0),
        out.stride(1), *part_strides, **constexprs(q_heads, kv_heads, head_dim, page, config, num_splits, pdl),
        **pdl_options(pdl), **launch_options(config),
    )  # fmt: skip
    return out
