"""Prefill attention for sm_90 in Gluon: warp-specialized, TMA loads, wgmma, two consumer warpgroups.

The Triton kernel of `prefill.py` leaves the overlap of one tile's softmax with the next tile's matrix
products to a second CTA per SM. This kernel schedules it itself, FlashAttention-3 style:

- One CTA per (128 query rows, sequence, query head). A one-warp loader partition issues every TMA load:
  the two 64-row query halves once, then K and V tiles of BLOCK_N keys into rings of STAGES buffers
  (mbarriers `k_ready`/`v_ready` per stage; `k_empty`/`v_empty` count both consumers' releases; the loader
  waits for each before refilling that buffer). A stage's K and V are released together once its PV product
  completes, or, with the config's `early_k_release`, its K as soon as its QK product has completed: tile j +
  STAGES's K then loads while tile j's V is still in use. In a 2-stage ring, releasing both after PV let the
  loader issue tile j + 1 only once tile j - 1's PV product was done, half an iteration before tile j + 1's QK
  product needed it. The early release pays on head_dim 256's 2-stage ring; the deeper rings of head_dim 64 and
  128 keep the release after PV (docs/PERF.md#prefill has the measurements; the outputs are bit-identical).
- Two consumer warpgroups, 64 query rows each, run the online softmax. Each issues tile j's QK^T product
  and tile j-1's PV product back to back (asynchronous wgmma), then computes tile j's softmax while the PV
  product runs (intra-warpgroup overlap); with PINGPONG they take turns issuing (two mbarriers), so one
  warpgroup's softmax runs under the other's products.
- Keys come from two spans. A cached prefix (prefix caching, an earlier chunk) is read from the paged cache:
  the loader looks up a tile's pages in the block table at once (a lane per page, for its K and its V) and
  issues one TMA box of PAGE rows per page into the tile's rows. The chunk's own keys are contiguous rows of k/v
  (what the engine just wrote), one TMA box per tile. Rows past a sequence's end are loaded (the next sequence's
  rows, or zeros) and masked.
- Registers: consumers get 240 per thread (setmaxnreg), the loader 24; 12 warps, one CTA per SM
  (shared memory at head_dim 128: Q 32 KB + STAGES x BLOCK_N / 2 KB, e.g. 3 x 64 KB for 128-key tiles; at 256:
  Q 64 KB + 2 x 64 KB for 64-key tiles, where a consumer's O accumulator alone takes 128 registers per thread).

Scope (`prefill.ws_plan` decides, with `supports`): sm_90, fp16/bf16, head_dim 64, 128 or 256, causal (with or
without a sliding window) or non-causal, no softcap; pages of 16/32/64 tokens. With a window, a CTA skips the key
tiles left of its rows' windows and masks the tiles on the window's edge. Everything else runs the Triton kernel.
"""

from __future__ import annotations

import triton

from vlchat.kernels.attention import launch_order
from vlchat.kernels.attention.gluon_sm90 import (
    LOG2E,
    TMA_PAGES,
    gl,
    gluon,
    issue_page_boxes,
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
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

ROWS = 64  # query rows per consumer warpgroup; a CTA holds two


def smem_bytes(config, head_dim: int, elem_size: int) -> int:
    """Shared memory of one CTA: the two consumers' query rows, the K and V rings and the mbarriers (229,816
    bytes as Triton 3.6 compiled 128-key tiles x 3 stages at head_dim 128, 196,984 for 64 x 2 at 256: this plus
    the compiler's few hundred bytes of scratch)."""
    return (2 * ROWS + 2 * config.num_stages * config.block_n) * head_dim * elem_size + 8 * (4 + 4 * config.num_stages)


def supports(q, k, v, k_cache, v_cache, softcap) -> bool:
    """Whether this kernel can run the call (otherwise the Triton kernel does): Gluon and an sm_90 GPU, the
    chunk's rows given, no softcap, unquantized caches, TMA-readable tensors. Dtype and head_dim are the config table's to decide
    (`ArchTable.prefill_ws_config`); the capability is checked here because newer archs take sm_90's table."""
    if not on_sm90(device_for(q)):
        return False
    if k is None or (softcap and softcap > 0):
        return False
    caches = () if k_cache is None else (k_cache, v_cache)
    if any(c.dtype != q.dtype for c in caches):  # quantized caches: the Triton kernel dequantizes them
        return False
    if any(c.shape[1] not in TMA_PAGES or not c.is_contiguous() for c in caches):  # pages flattened to rows
        return False
    return all(tma_rows_ok(t) for t in (q, k, v, *caches))


if gluon is not None:
    BLOCK_M = gl.constexpr(ROWS)

    @gluon.jit
    def _spans(cu_q_ptr, kv_lens_ptr, b, m_blk, window, BLOCK_N: gl.constexpr, PAGED: gl.constexpr,
               CAUSAL: gl.constexpr, HAS_WINDOW: gl.constexpr):  # fmt: skip
        """(q_start, q_len, prefix, first prefix tile, prefix tiles, first chunk tile, chunk tiles) of this CTA:
        iteration j < prefix tiles reads prefix tile first + j, the rest chunk tiles from its first. Without a
        window both firsts are compile-time zeros; with one they skip the tiles left of every row's window."""
        q_start = gl.load(cu_q_ptr + b)
        q_len = gl.load(cu_q_ptr + b + 1) - q_start
        if PAGED:
            prefix = gl.load(kv_lens_ptr + b) - q_len
        else:
            prefix = q_len * 0
        if CAUSAL:
            end = gl.minimum(q_len, (m_blk + 1) * 2 * BLOCK_M)
        else:
            end = q_len
        if HAS_WINDOW:  # lo: the first key (absolute position) any row of this CTA sees
            lo = gl.maximum(prefix + m_blk * 2 * BLOCK_M - window + 1, 0)
            pre_first = gl.minimum(lo // BLOCK_N, gl.cdiv(prefix, BLOCK_N))
            chunk_first = gl.minimum(gl.maximum(lo - prefix, 0) // BLOCK_N, gl.cdiv(end, BLOCK_N))
        else:
            pre_first = 0
            chunk_first = 0
        n_pre, n_chunk = gl.cdiv(prefix, BLOCK_N) - pre_first, gl.cdiv(end, BLOCK_N) - chunk_first
        return q_start, q_len, prefix, pre_first, n_pre, chunk_first, n_chunk

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, kc_desc, vc_desc, tables_ptr, stride_tb, q_smem, k_smem, v_smem, bars,
                cu_q_ptr, kv_lens_ptr, window, h, kvh, b, m_blk,
                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE: gl.constexpr,
                PAGED: gl.constexpr, CAUSAL: gl.constexpr, HAS_WINDOW: gl.constexpr):  # fmt: skip
        q_ready, k_ready, v_ready, k_empty, v_empty, turn = bars
        q_start, q_len, prefix, pre_first, n_pre, chunk_first, n_chunk = _spans(
            cu_q_ptr, kv_lens_ptr, b, m_blk, window, BLOCK_N, PAGED, CAUSAL, HAS_WINDOW
        )
        for wg in gl.static_range(2):
            mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
            row = q_start + (m_blk * 2 + wg) * BLOCK_M
            tma.async_copy_global_to_shared(q_desc, [row, h * HEAD_DIM], q_ready.index(wg), q_smem.index(wg))
        tile_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * q_desc.dtype.primitive_bitwidth // 8
        last_page = gl.cdiv(prefix, PAGE) - 1
        table = tables_ptr + b.to(gl.int64) * stride_tb
        for j in range(n_pre + n_chunk):
            s = j % STAGES
            phase = ((j // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(s), phase)
            mbarrier.expect(k_ready.index(s), tile_bytes)
            if j < n_pre:  # cached prefix: one box per page; pages past the prefix repeat its last page (masked)
                # its pages are looked up once, for its K and its V
                pages = load_page_lanes(table, (pre_first + j) * (BLOCK_N // PAGE), last_page, True, BLOCK_N // PAGE)
                issue_page_boxes(kc_desc, pages, 0, kvh * HEAD_DIM, k_ready.index(s), k_smem.index(s), PAGE)
                mbarrier.wait(v_empty.index(s), phase)
                mbarrier.expect(v_ready.index(s), tile_bytes)
                issue_page_boxes(vc_desc, pages, 0, kvh * HEAD_DIM, v_ready.index(s), v_smem.index(s), PAGE)
            else:  # the chunk's own rows
                coord = [q_start + (chunk_first + j - n_pre) * BLOCK_N, kvh * HEAD_DIM]
                tma.async_copy_global_to_shared(k_desc, coord, k_ready.index(s), k_smem.index(s))
                mbarrier.wait(v_empty.index(s), phase)
                mbarrier.expect(v_ready.index(s), tile_bytes)
                tma.async_copy_global_to_shared(v_desc, coord, v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _softmax(sc, j, m_i, l_i, rows, qk_scale, q_len, prefix, n_pre, n_full, s_layout: gl.constexpr,
                 BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
        """Mask tile j where needed, then the online-softmax update: (p, alpha, m, l)."""
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if j < n_pre:
            if (j + 1) * BLOCK_N > prefix:  # the prefix's last, partial tile
                sc = gl.where((cols < prefix)[None, :], sc, float("-inf"))
        elif j - n_pre >= n_full:  # chunk tiles some row of this warpgroup sees only in part
            cols = cols - n_pre * BLOCK_N  # position within the chunk
            if CAUSAL:
                ok = cols[None, :] <= rows[:, None]
            else:
                ok = (cols < q_len)[None, :] & (rows >= 0)[:, None]
            sc = gl.where(ok, sc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1) * qk_scale)
        p = gl.exp2(sc * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _softmax_window(sc, j, m_i, l_i, pos, first_pos, last_pos, qk_scale, window, prefix, q_len, pre_first,
                        n_pre, chunk_first, s_layout: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
        """_softmax for causal attention with a sliding window; pos: the rows' absolute positions, first_pos and
        last_pos their range."""
        if j < n_pre:
            col0 = (pre_first + j) * BLOCK_N
            span_end = prefix
        else:
            col0 = prefix + (chunk_first + j - n_pre) * BLOCK_N
            span_end = prefix + q_len
        if (col0 + BLOCK_N > span_end) | (col0 + BLOCK_N - 1 > first_pos) | (col0 <= last_pos - window):
            cols = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            sc = gl.where((cols < span_end)[None, :] & (cols[None, :] <= pos[:, None]), sc, float("-inf"))
            sc = gl.where(cols[None, :] > pos[:, None] - window, sc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: p and sums stay 0
        p = gl.exp2(sc * qk_scale - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _consumer(WG: gl.constexpr, q_smem, k_smem, v_smem, bars, out_ptr, stride_ot, stride_oh, qk_scale,
                  cu_q_ptr, kv_lens_ptr, window, h, b, m_blk,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGED: gl.constexpr,
                  CAUSAL: gl.constexpr, HAS_WINDOW: gl.constexpr, PINGPONG: gl.constexpr,
                  EARLY_K: gl.constexpr):  # fmt: skip
        q_ready, k_ready, v_ready, k_empty, v_empty, turn = bars
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        q_start, q_len, prefix, pre_first, n_pre, chunk_first, n_chunk = _spans(
            cu_q_ptr, kv_lens_ptr, b, m_blk, window, BLOCK_N, PAGED, CAUSAL, HAS_WINDOW
        )
        first_row = (m_blk * 2 + WG) * BLOCK_M  # within the chunk
        if CAUSAL:
            n_full = first_row // BLOCK_N  # chunk tiles every row of this warpgroup sees whole
        else:
            n_full = q_len // BLOCK_N
        n = n_pre + n_chunk
        rows = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        first_pos = prefix + first_row  # absolute positions (window only)
        last_pos = first_pos + BLOCK_M - 1
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)  # [rows, head_dim]
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(q_ready.index(WG), 0)
        q = q_smem.index(WG)

        # tile 0: its QK product alone
        mbarrier.wait(k_ready.index(0), 0)
        if PINGPONG:
            mbarrier.wait(turn.index(WG), WG ^ 1)
        sc = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)
        sc = warpgroup_mma_wait(0, deps=(sc,))
        if EARLY_K:  # K is read by its QK product only
            mbarrier.arrive(k_empty.index(0), count=1)
        if HAS_WINDOW:
            p, alpha, m_i, l_i = _softmax_window(sc, 0, m_i, l_i, prefix + rows, first_pos, last_pos, qk_scale,
                                                 window, prefix, q_len, pre_first, n_pre, chunk_first, s_layout,
                                                 BLOCK_N)  # fmt: skip
        else:
            p, alpha, m_i, l_i = _softmax(sc, 0, m_i, l_i, rows, qk_scale, q_len, prefix, n_pre, n_full, s_layout,
                                          BLOCK_N, CAUSAL)  # fmt: skip
        # tile j's QK product and tile j-1's PV product in flight together; tile j's softmax under the PV
        for j in range(1, n):
            s = j % STAGES
            sp = (j - 1) % STAGES
            mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
            pa = gl.convert_layout(p.to(q.dtype), p_layout)
            if PINGPONG:
                mbarrier.wait(turn.index(WG), (j & 1) ^ WG ^ 1)
            sc = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
            acc = warpgroup_mma(pa, v_smem.index(sp), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - WG), count=1)
            sc = warpgroup_mma_wait(1, deps=(sc,))
            if EARLY_K:
                mbarrier.arrive(k_empty.index(s), count=1)
            if HAS_WINDOW:
                p, alpha, m_i, l_i = _softmax_window(sc, j, m_i, l_i, prefix + rows, first_pos, last_pos, qk_scale,
                                                     window, prefix, q_len, pre_first, n_pre, chunk_first, s_layout,
                                                     BLOCK_N)  # fmt: skip
            else:
                p, alpha, m_i, l_i = _softmax(sc, j, m_i, l_i, rows, qk_scale, q_len, prefix, n_pre, n_full,
                                              s_layout, BLOCK_N, CAUSAL)  # fmt: skip
            acc = warpgroup_mma_wait(0, deps=(acc,))
            if not EARLY_K:
                mbarrier.arrive(k_empty.index(sp), count=1)
            mbarrier.arrive(v_empty.index(sp), count=1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        sl = (n - 1) % STAGES
        pa = gl.convert_layout(p.to(q.dtype), p_layout)
        mbarrier.wait(v_ready.index(sl), ((n - 1) // STAGES) & 1)
        acc = warpgroup_mma(pa, v_smem.index(sl), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        if not EARLY_K:
            mbarrier.arrive(k_empty.index(sl), count=1)
        mbarrier.arrive(v_empty.index(sl), count=1)

        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        o = acc / l_o[:, None]  # every row sees key 0 (causal) or every key: l >= 1
        o_rows = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        ptrs = out_ptr + ((q_start + o_rows).to(gl.int64) * stride_ot + h * stride_oh)[:, None] + cols[None, :]
        gl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=(o_rows < q_len)[:, None])  # rows past q_len: not ours

    @gluon.jit
    def _ws_prefill_kernel(
        q_desc, k_desc, v_desc, kc_desc, vc_desc, out_ptr, cu_q_ptr, kv_lens_ptr, tables_ptr,
        stride_ot, stride_oh, stride_tb, qk_scale, window,
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        PAGE: gl.constexpr, PAGED: gl.constexpr, CAUSAL: gl.constexpr, HAS_WINDOW: gl.constexpr,
        PINGPONG: gl.constexpr, HEADS_FIRST: gl.constexpr, EARLY_K: gl.constexpr,
    ):  # fmt: skip
        h, m_blk = launch_order.program_tile(HEADS_FIRST)
        b = gl.program_id(1)
        q_len = gl.load(cu_q_ptr + b + 1) - gl.load(cu_q_ptr + b)
        if m_blk * 2 * BLOCK_M >= q_len:
            return
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_ready.index(i), count=1)
            if PINGPONG:  # a barrier initialised and never used again can share its memory with other buffers
                mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # both consumers release a stage's K, then its V
            mbarrier.init(v_empty.index(i), count=2)
        bars = (q_ready, k_ready, v_ready, k_empty, v_empty, turn)
        # (the partitions' constexpr arguments must be written in the call: a tuple built beforehand turns them
        # into tensors)
        gl.warp_specialize([
            (_consumer, (0, q_smem, k_smem, v_smem, bars, out_ptr, stride_ot, stride_oh, qk_scale, cu_q_ptr,
                          kv_lens_ptr, window, h, b, m_blk, HEAD_DIM, BLOCK_N, STAGES, PAGED, CAUSAL, HAS_WINDOW,
                          PINGPONG, EARLY_K)),
            (_consumer, (1, q_smem, k_smem, v_smem, bars, out_ptr, stride_ot, stride_oh, qk_scale, cu_q_ptr,
                          kv_lens_ptr, window, h, b, m_blk, HEAD_DIM, BLOCK_N, STAGES, PAGED, CAUSAL, HAS_WINDOW,
                          PINGPONG, EARLY_K)),
            (_loader, (q_desc, k_desc, v_desc, kc_desc, vc_desc, tables_ptr, stride_tb, q_smem, k_smem, v_smem,
                       bars, cu_q_ptr, kv_lens_ptr, window, h, h // GROUP, b, m_blk, HEAD_DIM, BLOCK_N, STAGES,
                       PAGE, PAGED, CAUSAL, HAS_WINDOW)),
        ], [4, 1], [240, 24])  # fmt: skip


def launch(
    q, k, v, k_cache, v_cache, out, cu_q, kv_lens, tables, scale, max_seqlen_q, causal, window, config, cache_memo=None,
):  # fmt: skip
    """Run the kernel (`supports` must hold). k/v: the chunk's rows; k_cache/v_cache: the paged caches holding
    each sequence's cached prefix, or None (varlen: no prefix); their descriptors kept in `cache_memo`
    (gluon_sm90.row_descriptor)."""
    batch = cu_q.shape[0] - 1
    q_heads, head_dim = q.shape[1], q.shape[2]
    q_layout = shared_layout((ROWS, head_dim), q.dtype)
    kv_layout = shared_layout((config.block_n, head_dim), q.dtype)
    paged = k_cache is not None
    has_window = bool(causal and window and window > 0)
    k_desc, v_desc = row_descriptor(k, config.block_n, kv_layout), row_descriptor(v, config.block_n, kv_layout)
    page = k_cache.shape[1] if paged else 16
    # a page's box lands in a slice of the tile's buffer, so it takes the tile's layout
    kc_desc, vc_desc = (
        (row_descriptor(c, page, kv_layout, cache_memo) for c in (k_cache, v_cache)) if paged else (k_desc, v_desc)
    )
    m_blocks = triton.cdiv(max(int(max_seqlen_q), 1), 2 * ROWS)
    grid, heads_first = launch_order.grid(q_heads, batch, m_blocks)
    launch_compiled(_ws_prefill_kernel, grid,
        row_descriptor(q, ROWS, q_layout), k_desc, v_desc, kc_desc, vc_desc, out, cu_q, kv_lens if paged else cu_q,
        tables if paged else cu_q, out.stride(0), out.stride(1), tables.stride(0) if paged else 0, scale * LOG2E,
        int(window or 0) if has_window else 0,
        GROUP=q_heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.num_stages,
        PAGE=page, PAGED=paged, CAUSAL=bool(causal),
        HAS_WINDOW=has_window, PINGPONG=config.pingpong, HEADS_FIRST=heads_first,
        EARLY_K=config.early_k_release,
        num_warps=4, maxnreg=168,  # 12 warps x 32 x 168 = all 64K registers; setmaxnreg: 240 / 240 / 24
    )  # fmt: skip
    return out
