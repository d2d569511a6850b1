"""Prefill/extend attention in Triton: varlen queries against paged (or contiguous) K/V.

One program per (query tile of BLOCK_M rows, sequence, query head), FlashAttention-2
style: an online softmax over BLOCK_N-key tiles with fp32 accumulators. The queries of
sequence i are its last q_len positions (a cached prefix, or an earlier chunk, comes
first), so query row r sits at absolute position kv_len - q_len + r.

Keys come from up to two sources. The cached prefix (or, without fresh rows, every key)
is gathered from the paged cache through the block table. When the caller also passes
the chunk's own K/V rows (the tensors it just wrote to the cache), the chunk's keys are
read from those contiguous rows instead: on sm_90 through TMA tensor descriptors, which
a per-token page gather cannot use. A fresh prefill then never touches the page table.
The same kernel serves `varlen.py` (contiguous K/V only, no cache). On sm_90, calls within its scope
(`ws_plan`) run the warp-specialized Gluon kernel of `prefill_ws.py` instead.

Each source's key range is split in three loops: a masked head (sliding-window edge), an
unmasked middle (keys every row sees), a masked tail (the causal diagonal, or the end of
the source). Query tiles run from the last to the first so the longest causal tiles
start first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels.attention import kv_quant, launch_order, prefill_ws
from vlchat.kernels.attention.configs import PrefillConfig, WsPrefillConfig, check_dtype, table_for
from vlchat.kernels.attention.decode import _quant_args, _tanh, dequant_tile
from vlchat.kernels.attention.gluon_sm90 import LOG2E, tma_rows_ok
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # triton < 3.4: no host tensor descriptors, pointer loads only
    TensorDescriptor = None


@triton.jit
def _tile(base, offs_n, offs_d, n_ok, d_ok, MASK_N: tl.constexpr, EVEN_D: tl.constexpr):
    ptrs = base + offs_n[:, None] + offs_d[None, :]
    if MASK_N and EVEN_D:
        return tl.load(ptrs, mask=n_ok[:, None], other=0.0)
    elif MASK_N:
        return tl.load(ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=d_ok[None, :], other=0.0)


@triton.jit
def _dequant(x, sz_rows, n_ok, offs_d, mul, dtype, QUANT: tl.constexpr):
    """A paged K/V tile of a quantized cache as `dtype` (decode.dequant_tile, the fp8 multiplier applied)."""
    x = dequant_tile(x, sz_rows, n_ok, offs_d, dtype, QUANT)
    if QUANT == 1:
        x = (x.to(tl.float32) * mul).to(dtype)
    return x


@triton.jit
def _keys(
    acc, acc2, l_i, m_i, q, q2, k_src, v_src, table, lo, hi, key_off, limit, pos, window, pre_scale, post_scale,
    offs_d, offs_e, d_ok, row0, col0, stride_kb, stride_kt, stride_vb, stride_vt, quant,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, SRC: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
    QUANT: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Keys lo..hi (source-local index t; absolute position key_off + t) into the online softmax.
    SRC: 0 the paged cache through the block table, 1 contiguous rows by pointers, 2 rows by TMA descriptors.
    QUANT (the paged source only): the cache's format (kv_quant.QUANT_CODES); quant = (K scale/zero pointer,
    V scale/zero pointer, their block and token strides, the fp8 multipliers of K and V).
    SPLIT (pointer sources, unquantized): the head's columns offs_e beyond offs_d are a second block, q2 and acc2
    (head_split), so that a head_dim such as 80 runs as 64 + 16 columns instead of a padded 128."""
    if QUANT == 3:  # int4 pages: two dimensions a byte
        cols = offs_d // 2
    else:
        cols = offs_d
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_ok = offs_t < limit
        if SRC == 2:  # TMA: rows row0 + t of a [tokens, heads * d] descriptor, this head's columns
            k = k_src.load([row0 + t0, col0])
        else:
            if SRC == 0:
                page = tl.load(table + offs_t // PAGE, mask=t_ok, other=0).to(tl.int64)
                k_rows = page * stride_kb + (offs_t % PAGE) * stride_kt
                v_rows = page * stride_vb + (offs_t % PAGE) * stride_vt
            else:
                k_rows = offs_t.to(tl.int64) * stride_kt
                v_rows = offs_t.to(tl.int64) * stride_vt
            k = _tile(k_src, k_rows, cols, t_ok, d_ok, MASKED, EVEN_D)  # [BLOCK_N, BLOCK_D]
            if QUANT != 0:
                ksz, vsz, stride_sb, stride_st, stride_ub, stride_ut, k_mul, v_mul = quant
                k_sz = ksz + page * stride_sb + (offs_t % PAGE) * stride_st
                k = _dequant(k, k_sz, t_ok, offs_d, k_mul, q.dtype, QUANT)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        if SPLIT:
            k2 = _tile(k_src, k_rows, offs_e, t_ok, d_ok, MASKED, True)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=PRECISION)
        if SOFTCAP:
            s = _tanh(s * pre_scale) * post_scale
        if MASKED:
            if not SOFTCAP:
                s = s * post_scale
            vis = t_ok[None, :]
            if CAUSAL:
                n = key_off + offs_t
                vis = vis & (n[None, :] <= pos[:, None])
                if HAS_WINDOW:
                    vis = vis & (n[None, :] > pos[:, None] - window)
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
            p = tl.exp2(s - m_new[:, None])
        elif SOFTCAP:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
        else:  # scale folded into the exponent's multiply-add
            m_new = tl.maximum(m_i, tl.max(s, 1) * post_scale)
            p = tl.exp2(s * post_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if SRC == 2:
            v = v_src.load([row0 + t0, col0])
        else:
            v = _tile(v_src, v_rows, cols, t_ok, d_ok, MASKED, EVEN_D)
            if QUANT != 0:
                v_sz = vsz + page * stride_ub + (offs_t % PAGE) * stride_ut
                v = _dequant(v, v_sz, t_ok, offs_d, v_mul, q.dtype, QUANT)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        if SPLIT:
            v2 = _tile(v_src, v_rows, offs_e, t_ok, d_ok, MASKED, True)
            acc2 = tl.dot(p.to(v2.dtype), v2, acc2 * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def _span(
    acc, acc2, l_i, m_i, q, q2, k_src, v_src, table, key_off, limit, first, last, pos, window, pre_scale,
    post_scale, offs_d, offs_e, d_ok, row0, col0, stride_kb, stride_kt, stride_vb, stride_vt, quant,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, SRC: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
    QUANT: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """One source's keys t in [0, limit) (absolute position key_off + t) for query rows first..last."""
    if CAUSAL:
        hi = tl.minimum(limit, last - key_off + 1)
        full_hi = (first - key_off + 1) // BLOCK_N * BLOCK_N  # keys <= first: seen by every row
        if HAS_WINDOW:
            lo = tl.maximum(first - window + 1 - key_off, 0) // BLOCK_N * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(last - window + 1 - key_off, 0), BLOCK_N) * BLOCK_N
        else:
            lo = 0
            full_lo = 0
    else:
        hi = limit
        lo = 0
        full_lo = 0
        full_hi = limit
    full_hi = tl.minimum(full_hi, limit // BLOCK_N * BLOCK_N)  # a tile past the source's end is masked
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    acc, acc2, l_i, m_i = _keys(
        acc, acc2, l_i, m_i, q, q2, k_src, v_src, table, lo, full_lo, key_off, limit, pos, window, pre_scale,
        post_scale, offs_d, offs_e, d_ok, row0, col0, stride_kb, stride_kt, stride_vb, stride_vt, quant,
        BLOCK_N, PAGE, SRC, True, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, QUANT, SPLIT,
    )  # fmt: skip
    acc, acc2, l_i, m_i = _keys(
        acc, acc2, l_i, m_i, q, q2, k_src, v_src, table, full_lo, full_hi, key_off, limit, pos, window, pre_scale,
        post_scale, offs_d, offs_e, d_ok, row0, col0, stride_kb, stride_kt, stride_vb, stride_vt, quant,
        BLOCK_N, PAGE, SRC, False, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, QUANT, SPLIT,
    )  # fmt: skip
    acc, acc2, l_i, m_i = _keys(
        acc, acc2, l_i, m_i, q, q2, k_src, v_src, table, full_hi, hi, key_off, limit, pos, window, pre_scale,
        post_scale, offs_d, offs_e, d_ok, row0, col0, stride_kb, stride_kt, stride_vb, stride_vt, quant,
        BLOCK_N, PAGE, SRC, True, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, QUANT, SPLIT,
    )  # fmt: skip
    return acc, acc2, l_i, m_i


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, out_ptr, q_desc, k_desc, v_desc, cu_q_ptr, kv_lens_ptr, tables_ptr,
    ksz_ptr, vsz_ptr, pre_scale, post_scale, window, k_mul, v_mul,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh, stride_ot, stride_oh, stride_tb,
    stride_sb, stride_st, stride_sh, stride_ub, stride_ut, stride_uh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, ROWS: tl.constexpr, TMA: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr, HEADS_FIRST: tl.constexpr, QUANT: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    h, m_blk = launch_order.program_tile(HEADS_FIRST)
    b = tl.program_id(1)
    kvh = h // GROUP
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if m_blk * BLOCK_M >= q_len:
        return
    if PAGED:
        kv_len = tl.load(kv_lens_ptr + b)
    else:
        kv_len = q_len
    prefix = kv_len - q_len

    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = BLOCK_D + tl.arange(0, BLOCK_E)  # SPLIT: the head's columns past the first block
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64) * stride_qt + h * stride_qh
    if TMA:  # rows past q_len belong to the next sequence: loaded, never stored
        q = q_desc.load([q_start + m_blk * BLOCK_M, h * HEAD_DIM])
    else:
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if SPLIT:
        q2 = tl.load(q_ptr + q_rows[:, None] + offs_e[None, :], mask=m_ok[:, None], other=0.0)
    else:
        q2 = q
    pos = prefix + offs_m  # [BLOCK_M] absolute positions
    first = prefix + m_blk * BLOCK_M
    last = prefix + tl.minimum(q_len, (m_blk + 1) * BLOCK_M) - 1

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
    if PAGED:  # the cached prefix, or every key when no fresh rows were given
        if ROWS:
            paged_end = prefix
        else:
            paged_end = kv_len
        quant = (ksz_ptr + kvh * stride_sh, vsz_ptr + kvh * stride_uh, stride_sb, stride_st, stride_ub, stride_ut,
                 k_mul, v_mul)  # fmt: skip
        acc, acc2, l_i, m_i = _span(
            acc, acc2, l_i, m_i, q, q2, kc_ptr + kvh * stride_ch, vc_ptr + kvh * stride_dh,
            tables_ptr + b.to(tl.int64) * stride_tb, 0, paged_end, first, last, pos, window, pre_scale, post_scale,
            offs_d, offs_e, d_ok, 0, 0, stride_cb, stride_ct, stride_db, stride_dt, quant,
            BLOCK_N, PAGE, 0, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, QUANT, SPLIT,
        )  # fmt: skip
    if ROWS:  # the chunk's own keys, contiguous rows from q_start
        if TMA:
            acc, acc2, l_i, m_i = _span(
                acc, acc2, l_i, m_i, q, q2, k_desc, v_desc, tables_ptr, prefix, q_len, first, last, pos, window,
                pre_scale, post_scale, offs_d, offs_e, d_ok, q_start, kvh * HEAD_DIM, 0, 0, 0, 0, 0,
                BLOCK_N, PAGE, 2, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, 0, False,
            )  # fmt: skip
        else:
            acc, acc2, l_i, m_i = _span(
                acc, acc2, l_i, m_i, q, q2, k_ptr + q_start.to(tl.int64) * stride_kt + kvh * stride_kh,
                v_ptr + q_start.to(tl.int64) * stride_vt + kvh * stride_vh, tables_ptr, prefix, q_len, first, last,
                pos, window, pre_scale, post_scale, offs_d, offs_e, d_ok, 0, 0, 0, stride_kt, 0, stride_vt, 0,
                BLOCK_N, PAGE, 1, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION, 0, SPLIT,
            )  # fmt: skip
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o_rows = (q_start + offs_m).to(tl.int64) * stride_ot + h * stride_oh
    tl.store(
        out_ptr + o_rows[:, None] + offs_d[None, :], (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )
    if SPLIT:
        o2 = acc2 * inv_l[:, None]
        tl.store(out_ptr + o_rows[:, None] + offs_e[None, :], o2.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


def head_split(head_dim: int, split: bool = True) -> tuple[int, int]:
    """(first, second) column blocks of a head, both powers of two (Triton's tiles): with `split`, a head_dim that
    is one power of two plus a smaller one of at least 16 runs as two blocks (80 = 64 + 16, 96 = 64 + 32, 48 = 32 +
    16) rather than padded to the next power of two, which would take 1.6x the tensor-core work at 80; any other
    as one block padded to the next power of two, second 0 (a compiled tl.dot takes K >= 16, so a head_dim under
    16 is padded to 16 with its columns masked)."""
    padded = max(16, triton.next_power_of_2(head_dim))
    first = padded // 2
    second = head_dim - first
    if not split or padded == head_dim or second < 16 or second & (second - 1):
        return padded, 0
    return first, second


def _descriptor(t, block_rows, block_d):
    """A 2-D TMA descriptor over [tokens, heads * head_dim] of a [tokens, heads, head_dim] tensor, or None."""
    tokens, heads, head_dim = t.shape
    if not tma_rows_ok(t) or (heads * head_dim * t.element_size()) % 16:
        return None
    return TensorDescriptor(t, [tokens, heads * head_dim], [t.stride(0), 1], [block_rows, block_d])


def _tma_descriptors(q, k, v, config):
    """Descriptors for q and the fresh k/v rows when the config asks for TMA and the tensors allow it."""
    if not config.tma or TensorDescriptor is None or k is None or q.dtype == torch.float32:
        return None
    # a box holds the head as one tile: a padded head would read its neighbour's columns (and one of fewer than 16
    # columns would reach tl.dot with K < 16, which a compiled dot refuses), a split one takes two
    if head_split(q.shape[-1]) != (q.shape[-1], 0):
        return None
    descs = (
        _descriptor(q, config.block_m, q.shape[-1]),
        _descriptor(k, config.block_n, q.shape[-1]),
        _descriptor(v, config.block_n, q.shape[-1]),
    )
    return None if None in descs else descs


def launch(q, k, v, k_cache, v_cache, out, cu_q, kv_lens, tables, scale, max_seqlen_q, causal, window, softcap, config,
           k_scale=None, v_scale=None):  # fmt: skip
    """Launch the shared kernel. k/v: the chunk's own rows [tokens, kv_heads, d] or None; k_cache/v_cache:
    paged caches [blocks, page, kv_heads, d] or None (varlen), quantized as kv_quant.py says with k_scale/v_scale."""
    batch = cu_q.shape[0] - 1
    q_heads, head_dim = q.shape[1], q.shape[2]
    paged, rows = k_cache is not None, k is not None
    kv_heads = (k if rows else k_cache).shape[-2]
    descs = _tma_descriptors(q, k, v, config)
    fmt = kv_quant.cache_format(k_cache, head_dim) if paged else "auto"
    k_mul, v_mul, ksz, vsz, sz_strides = _quant_args(fmt, k_cache, k_scale, v_scale)
    if fmt == "fp8":
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    kc, vc = (k_cache, v_cache) if paged else (k, v)
    kr, vr = (k, v) if rows else (k_cache, v_cache)
    c_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3]) if paged else (0,) * 6
    r_strides = (*k.stride()[:2], *v.stride()[:2]) if rows else (0,) * 4
    softcapped = bool(softcap and softcap > 0)
    # quantized pages are dequantized over one block of columns (int4 packs two a byte): no split there
    block_d, block_e = head_split(head_dim, split=fmt == "auto")
    if softcapped:
        pre_scale, post_scale = scale / softcap, softcap * LOG2E
    else:
        pre_scale, post_scale = 1.0, scale * LOG2E
    m_blocks = triton.cdiv(max(int(max_seqlen_q), 1), config.block_m)
    grid, heads_first = launch_order.grid(q_heads, batch, m_blocks)
    launch_compiled(_prefill_kernel, grid,
        q, kr, vr, kc, vc, out, *(descs or (q, kr, vr)), cu_q, kv_lens, tables, ksz if paged else q, vsz if paged else q,
        float(pre_scale), float(post_scale), int(window or 0), float(k_mul), float(v_mul),
        q.stride(0), q.stride(1), *r_strides, *c_strides, out.stride(0), out.stride(1),
        tables.stride(0) if tables.dim() == 2 else 0, *sz_strides,
        GROUP=q_heads // kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_E=max(16, block_e),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, PAGE=k_cache.shape[1] if paged else 1, PAGED=paged,
        ROWS=rows, TMA=descs is not None, CAUSAL=bool(causal),
        HAS_WINDOW=bool(causal and window and window > 0), SOFTCAP=softcapped, EVEN_D=block_d + block_e == head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", HEADS_FIRST=heads_first,
        QUANT=kv_quant.QUANT_CODES[fmt], SPLIT=block_e > 0, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return out


def _check_operands(q, k, v):
    """k, v: caches or rows, heads in dim -2 (quantized caches keep their own dtype: kv_quant.py)."""
    if q.shape[1] % k.shape[-2]:
        raise ValueError(f"q_heads {q.shape[1]} is not a multiple of kv_heads {k.shape[-2]}")
    quantized = kv_quant.cache_format(k, q.shape[-1]) != "auto"
    if (not quantized and q.dtype != k.dtype) or v.dtype != k.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of q, k and v must be contiguous")


def prepare(q, k, v, device, config, out):
    """Checks shared by prefill and varlen; returns (config, out)."""
    _check_operands(q, k, v)
    table = table_for(device or device_for(q))
    check_dtype(table, q.dtype)
    return config or table.prefill_config(q.shape[-1], q.dtype), torch.empty_like(q) if out is None else out


def ws_plan(q, k, v, k_cache, v_cache, causal, window, softcap, device, config) -> WsPrefillConfig | None:
    """The warp-specialized kernel's config (prefill_ws.py) when it can run this call: an sm_90 table entry for
    this head_dim and dtype, and a call within its scope. A config passed in (tests running an arch's Triton
    config) keeps the Triton kernel."""
    if config is not None:
        return None
    windowed = bool(causal and window and window > 0)
    ws = table_for(device or device_for(q)).prefill_ws_config(q.shape[-1], q.dtype, windowed)
    return ws if ws and prefill_ws.supports(q, k, v, k_cache, v_cache, softcap) else None


def paged_prefill_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_seqlen_q, causal=True,
    sliding_window=None, softcap=0.0, k=None, v=None, *, device=None, config: PrefillConfig | None = None, out=None,
    cache_memo: dict | None = None, k_scale=None, v_scale=None,
):  # fmt: skip
    """Paged prefill: the warp-specialized Gluon kernel where `ws_plan` allows (sm_90), else the Triton kernel;
    `device`/`config` override the arch table (tests run other archs' configs; a config forces Triton).

    k, v (optional): the chunk's own K/V rows [total_q, kv_heads, head_dim], the ones just written to the
    cache; given, the chunk's keys are read from them and only the cached prefix from the pages.
    cache_memo: as paged_decode_attention's. Quantized caches (kv_quant.py; k_scale/v_scale as their format takes
    them) run the Triton kernel, which dequantizes the prefix's tiles in registers; the chunk's own rows (k, v)
    are read as they are."""
    # q: [total_q, q_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim]
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("q must be [tokens, q_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim]")
    if k_cache.shape[3] != kv_quant.storage_dim(kv_quant.cache_format(k_cache, q.shape[2]), q.shape[2]):
        raise ValueError(f"head_dim mismatch: q {tuple(q.shape)}, caches {tuple(k_cache.shape)}")
    if (k is None) != (v is None):
        raise ValueError("pass both k and v (the chunk's rows), or neither")
    if k is not None and (k.shape != v.shape or k.shape != (q.shape[0], k_cache.shape[2], q.shape[2])):
        raise ValueError("k and v must be [total_q, kv_heads, head_dim], the rows of the chunk's tokens")
    if cu_seqlens_q.dtype != torch.int32 or seq_lens.dtype != torch.int32 or block_tables.dtype != torch.int32:
        raise TypeError("cu_seqlens_q, seq_lens and block_tables must be int32")
    kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, q.shape[-1])
    ws = ws_plan(q, k, v, k_cache, v_cache, causal, sliding_window, softcap, device, config)
    config, out = prepare(q, k_cache, v_cache, device, config, out)
    if k is not None:
        _check_operands(q, k, v)
    if q.shape[0] == 0:
        return out
    if ws is not None:
        return prefill_ws.launch(
            q, k, v, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables, scale, max_seqlen_q, causal,
            sliding_window, ws, cache_memo,
        )  # fmt: skip
    return launch(
        q, k, v, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables, scale, max_seqlen_q, causal,
        sliding_window, softcap, config, k_scale, v_scale,
    )  # fmt: skip
