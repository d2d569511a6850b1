"""Prefill/extend attention in Triton: varlen queries against paged (or contiguous) K/V.

One program per (query tile of BLOCK_M rows, sequence, query head), FlashAttention-2
style: an online softmax over BLOCK_N-key tiles with fp32 accumulators. The queries of
sequence i are its last q_len positions (a cached prefix, or an earlier chunk, comes
first), so query row r sits at absolute position kv_len - q_len + r.

The key range of a tile is split in three loops: a masked head (sliding-window edge),
an unmasked middle (keys every row sees), a masked tail (the causal diagonal, or the
end of the sequence). Query tiles run from the last to the first so the longest causal
tiles start first. The same kernel serves `varlen.py` (contiguous K/V, PAGED=False).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.configs import PrefillConfig, check_dtype, table_for
from kernels.attention.decode import _tanh
from kernels.device import device_for


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
def _keys(
    acc, l_i, m_i, q, k_base, v_base, table, lo, hi, pos, kv_len, window, scale, softcap,
    offs_d, d_ok, stride_kb, stride_kt, stride_vb, stride_vt,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_len
        if PAGED:
            page = tl.load(table + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
            k_rows = page * stride_kb + (offs_n % PAGE) * stride_kt
            v_rows = page * stride_vb + (offs_n % PAGE) * stride_vt
        else:
            k_rows = offs_n.to(tl.int64) * stride_kt
            v_rows = offs_n.to(tl.int64) * stride_vt
        k = _tile(k_base, k_rows, offs_d, n_ok, d_ok, MASKED, EVEN_D)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:
            s = _tanh(s * (scale / softcap)) * (softcap * 1.4426950408889634)
        else:
            s = s * (scale * 1.4426950408889634)
        if MASKED:
            vis = n_ok[None, :]
            if CAUSAL:
                vis = vis & (offs_n[None, :] <= pos[:, None])
                if HAS_WINDOW:
                    vis = vis & (offs_n[None, :] > pos[:, None] - window)
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _tile(v_base, v_rows, offs_d, n_ok, d_ok, MASKED, EVEN_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, kv_lens_ptr, tables_ptr,
    scale, softcap, window,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_tb,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    m_blk = tl.num_programs(0) - 1 - tl.program_id(0)  # longest causal tiles first
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if m_blk * BLOCK_M >= q_len:
        return
    if PAGED:
        kv_len = tl.load(kv_lens_ptr + b)
        k_base = k_ptr + kvh * stride_kh
        v_base = v_ptr + kvh * stride_vh
    else:
        kv_len = q_len
        k_base = k_ptr + q_start.to(tl.int64) * stride_kt + kvh * stride_kh
        v_base = v_ptr + q_start.to(tl.int64) * stride_vt + kvh * stride_vh
    table = tables_ptr + b.to(tl.int64) * stride_tb
    prefix = kv_len - q_len

    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64) * stride_qt + h * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    pos = prefix + offs_m  # [BLOCK_M] absolute positions
    first = prefix + m_blk * BLOCK_M
    last = prefix + tl.minimum(q_len, (m_blk + 1) * BLOCK_M) - 1
    if CAUSAL:
        hi = last + 1
        full_hi = (first + 1) // BLOCK_N * BLOCK_N  # keys <= first: seen by every row
        if HAS_WINDOW:
            lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(last - window + 1, 0), BLOCK_N) * BLOCK_N
        else:
            lo = 0
            full_lo = 0
    else:
        hi = kv_len
        lo = 0
        full_lo = 0
        full_hi = kv_len // BLOCK_N * BLOCK_N
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, l_i, m_i = _keys(
        acc, l_i, m_i, q, k_base, v_base, table, lo, full_lo, pos, kv_len, window, scale, softcap,
        offs_d, d_ok, stride_kb, stride_kt, stride_vb, stride_vt,
        BLOCK_N, PAGE, PAGED, True, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _keys(
        acc, l_i, m_i, q, k_base, v_base, table, full_lo, full_hi, pos, kv_len, window, scale, softcap,
        offs_d, d_ok, stride_kb, stride_kt, stride_vb, stride_vt,
        BLOCK_N, PAGE, PAGED, False, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _keys(
        acc, l_i, m_i, q, k_base, v_base, table, full_hi, hi, pos, kv_len, window, scale, softcap,
        offs_d, d_ok, stride_kb, stride_kt, stride_vb, stride_vt,
        BLOCK_N, PAGE, PAGED, True, CAUSAL, HAS_WINDOW, SOFTCAP, EVEN_D, PRECISION,
    )  # fmt: skip
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + offs_m).to(tl.int64) * stride_ot + h * stride_oh
    tl.store(
        out_ptr + o_rows[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :]
    )


def launch(q, k, v, out, cu_q, kv_lens, tables, scale, max_seqlen_q, causal, window, softcap, paged, config):
    """Launch the shared kernel; k/v are caches [blocks, page, kv_heads, d] (paged) or rows [tokens, kv_heads, d]."""
    batch = cu_q.shape[0] - 1
    q_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[-2]
    if paged:
        k_strides, v_strides, page = k.stride()[:3], v.stride()[:3], k.shape[1]
    else:
        k_strides, v_strides, page = (0, *k.stride()[:2]), (0, *v.stride()[:2]), 1
    grid = (triton.cdiv(max(int(max_seqlen_q), 1), config.block_m), batch, q_heads)
    _prefill_kernel[grid](
        q, k, v, out, cu_q, kv_lens, tables, float(scale), float(softcap or 1.0), int(window or 0),
        q.stride(0), q.stride(1), *k_strides, *v_strides, out.stride(0), out.stride(1),
        tables.stride(0) if tables.dim() == 2 else 0,
        GROUP=q_heads // kv_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, PAGE=page, PAGED=paged, CAUSAL=bool(causal),
        HAS_WINDOW=bool(causal and window and window > 0), SOFTCAP=bool(softcap and softcap > 0),
        EVEN_D=triton.next_power_of_2(head_dim) == head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out


def prepare(q, k, v, device, config, out):
    """Checks shared by prefill and varlen (k, v: caches or rows, heads in dim -2); returns (config, out)."""
    if q.shape[1] % k.shape[-2]:
        raise ValueError(f"q_heads {q.shape[1]} is not a multiple of kv_heads {k.shape[-2]}")
    if q.dtype != k.dtype or v.dtype != k.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of q, k and v must be contiguous")
    table = table_for(device or device_for(q))
    check_dtype(table, q.dtype)
    return config or table.prefill_config(q.shape[-1]), torch.empty_like(q) if out is None else out


def paged_prefill_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_seqlen_q, causal=True,
    sliding_window=None, softcap=0.0, *, device=None, config: PrefillConfig | None = None, out=None,
):  # fmt: skip
    """Triton paged prefill; `device`/`config` override the arch table (tests run other archs' configs)."""
    # q: [total_q, q_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim]
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError("q must be [tokens, q_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim]")
    if cu_seqlens_q.dtype != torch.int32 or seq_lens.dtype != torch.int32 or block_tables.dtype != torch.int32:
        raise TypeError("cu_seqlens_q, seq_lens and block_tables must be int32")
    config, out = prepare(q, k_cache, v_cache, device, config, out)
    if q.shape[0] == 0:
        return out
    return launch(
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables, scale, max_seqlen_q, causal,
        sliding_window, softcap, True, config,
    )  # fmt: skip
