"""Plain-torch attention: the ground truth of the kernel tests and the CPU serving path.

Every op here has the signature of its public counterpart in `kernels.attention`
(see docs/INTERFACES.md). Scores are accumulated in float32 (float64 inputs stay
float64, which the tests use as ground truth); the output has the dtype of `q`.

Masking rules shared by all ops (and by the Triton kernels):
- a query at absolute position p sees key j when j <= p (causal) and, with a
  sliding window W, when j > p - W; non-causal attention ignores the window;
- softcap c > 0 replaces each scaled score s by c * tanh(s / c) (Gemma-2);
- a query row that sees no key at all gets a zero output, never NaN.

Decode is vectorized over the batch; prefill and varlen loop over sequences
(never over tokens) and over query chunks sized to bound the score matrix.
On a CPU tensor the decode path trims the block table to the longest sequence
(a host sync); on a GPU tensor it reads the whole table and syncs nothing.

The CPU serving path of fp32 decode without softcap (`_decode_sdpa`) gathers each
sequence's own rows (its window's, with a sliding window) and runs torch's fused
SDPA on them: no padded keys, no mask, one call per sequence instead of a dozen
tensor ops over the padded batch, which cost the demo model's CPU decode step more than
all its other ops together (docs/PERF.md#engine-and-host). Prefill and
varlen attention in fp32 on the CPU without softcap call SDPA per sequence and query
chunk as well (with the causal/window mask as a boolean mask). The tests keep their
ground truth in float64, which takes the explicit form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlchat.kernels.attention import kv_quant

# Bound on the elements of one score matrix [heads, q_chunk, keys] in prefill.
_SCORE_ELEMENTS = 1 << 25


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """Store k/v rows into their paged-cache slots, quantized as the cache's format (kv_quant.py); slots < 0 are
    skipped."""
    # k, v: [tokens, kv_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim]
    kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, k.shape[-1])
    slots = slot_mapping.to(torch.long)
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    kv_quant.write_rows(k, k_cache, k_scale, slots)
    kv_quant.write_rows(v, v_cache, v_scale, slots)


def _softmax_rows(scores, visible):
    """Softmax over the last dim with `visible` as mask; rows with no visible key give zeros."""
    scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = torch.exp(scores - row_max)  # exp(-inf) = 0 on masked keys
    denom = probs.sum(dim=-1, keepdim=True)
    return probs / torch.where(denom > 0, denom, torch.ones_like(denom))


def _scale_and_cap(scores, scale, softcap):
    scores = scores * scale
    if softcap and softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


def _visible(q_pos, k_pos, kv_len, causal, sliding_window):
    """Mask [.., q, k] of keys each query sees: q_pos [..., q, 1], k_pos [k], kv_len broadcastable."""
    vis = k_pos < kv_len
    if causal:
        vis = vis & (k_pos <= q_pos)
        if sliding_window is not None and sliding_window > 0:
            vis = vis & (k_pos > q_pos - sliding_window)
    return vis


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window=None, num_splits=None, out=None, softcap=0.0,
    *, config=None, cache_memo=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """One query token per sequence against its paged K/V (num_splits, the kernel config and the caches' descriptor
    memo are ignored here); quantized caches (kv_quant.py) are dequantized as they are gathered."""
    # q: [batch, q_heads, head_dim]; block_tables: [batch, max_blocks]; seq_lens: [batch]
    fmt = kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, q.shape[-1])
    if _fused_cpu(q, softcap):
        return _decode_sdpa(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, out, k_scale, v_scale,
                            fmt)  # fmt: skip
    batch, q_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    acc = _acc_dtype(q.dtype)
    tables = block_tables.to(torch.long)
    if not q.is_cuda and batch > 0:
        used = (int(seq_lens.max()) + block_size - 1) // block_size
        tables = tables[:, : max(used, 1)]
    tables = tables.clamp(0, num_blocks - 1)  # entries past a sequence's end may be garbage
    ctx = tables.shape[1] * block_size
    keys = _rows(k_cache, k_scale, tables, acc, fmt).reshape(
        batch, ctx, kv_heads, head_dim
    )  # [batch, ctx, kv_heads, d]
    vals = _rows(v_cache, v_scale, tables, acc, fmt).reshape(batch, ctx, kv_heads, head_dim)
    qg = q.reshape(batch, kv_heads, group, head_dim).to(acc)  # [batch, kv_heads, group, d]
    scores = torch.einsum("bhgd,bchd->bhgc", qg, keys)  # [batch, kv_heads, group, ctx]
    scores = _scale_and_cap(scores, scale, softcap)
    kv_len = seq_lens.to(torch.long).view(batch, 1, 1, 1)
    k_pos = torch.arange(ctx, device=q.device)
    vis = _visible(kv_len - 1, k_pos, kv_len, True, sliding_window)  # [batch, 1, 1, ctx]
    probs = _softmax_rows(scores, vis)
    res = torch.einsum("bhgc,bchd->bhgd", probs, vals).reshape(batch, q_heads, head_dim)
    if out is None:
        return res.to(q.dtype)
    out.copy_(res)
    return out


def _decode_sdpa(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, out, k_scale, v_scale, fmt):
    """paged_decode_attention on the CPU in fp32 without softcap (module doc): per sequence, SDPA over the keys its
    query sees (the last `sliding_window` of them with a window), GQA through enable_gqa."""
    out = torch.empty_like(q) if out is None else out
    for b, length in enumerate(seq_lens.tolist()):
        start = max(0, length - sliding_window) if sliding_window is not None and sliding_window > 0 else 0
        if length <= start:
            out[b] = 0.0  # no key: a zero row, as everywhere here
            continue
        k = _gather_paged(k_cache, block_tables[b], length, k_scale, q.dtype, fmt)[start:]
        v = _gather_paged(v_cache, block_tables[b], length, v_scale, q.dtype, fmt)[start:]
        out[b : b + 1] = _sdpa_rows(q[b : b + 1], k, v, scale)
    return out


def _fused_cpu(q, softcap) -> bool:
    """Whether this call takes the fused SDPA path (module doc): fp32 on the CPU, no softcap."""
    return not q.is_cuda and q.dtype == torch.float32 and not (softcap and softcap > 0)


def _sdpa_rows(q, k, v, scale, mask=None):
    """SDPA of queries q [m, q_heads, d] over rows k/v [s, kv_heads, d] (GQA through enable_gqa) -> [m, q_heads, d]."""
    res = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
    )  # [q_heads, m, d]
    return res.transpose(0, 1)


def _attend(q, k, v, q_start, scale, causal, sliding_window, softcap, out):
    """Attention of one sequence: q [n, q_heads, d] at positions q_start.., k/v [s, kv_heads, d]; writes out [n, ...]."""
    n, q_heads, head_dim = q.shape
    s, kv_heads, _ = k.shape
    group = q_heads // kv_heads
    acc = _acc_dtype(q.dtype)
    k = k.to(acc)
    v = v.to(acc)
    k_pos = torch.arange(s, device=q.device)
    chunk = max(1, _SCORE_ELEMENTS // max(1, q_heads * s))
    fused = _fused_cpu(q, softcap) and s > 0
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        q_pos = torch.arange(q_start + lo, q_start + hi, device=q.device).view(-1, 1)
        if fused:  # every causal query sees at least its own key, so no row is empty
            mask = _visible(q_pos, k_pos, s, True, sliding_window) if causal else None
            out[lo:hi] = _sdpa_rows(q[lo:hi], k, v, scale, mask)
            continue
        qg = q[lo:hi].reshape(hi - lo, kv_heads, group, head_dim).to(acc)  # [m, kv_heads, group, d]
        scores = torch.einsum("mhgd,shd->hgms", qg, k)  # [kv_heads, group, m, s]
        scores = _scale_and_cap(scores, scale, softcap)
        probs = _softmax_rows(scores, _visible(q_pos, k_pos, s, causal, sliding_window))
        res = torch.einsum("hgms,shd->mhgd", probs, v)
        out[lo:hi] = res.reshape(hi - lo, q_heads, head_dim).to(out.dtype)


def _rows(cache, scale, index, dtype, fmt):
    """cache[index] as `dtype`, dequantized where the cache's format `fmt` is quantized (kv_quant.py)."""
    if fmt == "fp8":  # indexing has no float8 kernel on the CPU: index the bits
        return kv_quant.dequantize(cache.view(torch.uint8)[index].view(cache.dtype), scale, dtype, fmt)
    if fmt in kv_quant.LEVELS:
        return kv_quant.dequantize(cache[index], scale[index], dtype, fmt)
    return cache[index].to(dtype)


def _gather_paged(cache, table_row, length, scale=None, dtype=None, fmt="auto"):
    """The first `length` rows [length, kv_heads, head_dim] of one sequence's paged cache: as stored, or
    dequantized to `dtype` where given (a quantized cache needs it, with its scale and format)."""
    block_size = cache.shape[1]
    used = (length + block_size - 1) // block_size
    index = table_row[:used].to(torch.long)
    rows = cache[index] if dtype is None else _rows(cache, scale, index, dtype, fmt)  # [used, block_size, kv_heads, d]
    return rows.reshape(used * block_size, *rows.shape[2:])[:length]


def paged_prefill_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_seqlen_q, causal=True,
    sliding_window=None, softcap=0.0, k=None, v=None, *, cache_memo=None, k_scale=None, v_scale=None,
):  # fmt: skip
    """Varlen queries (the last tokens of each sequence) against their paged K/V, prefix included (the caches'
    descriptor memo is ignored here).

    k, v (the chunk's own rows, already in the cache): given with an unquantized cache, the reference still reads
    every key from the pages (the same values); given with a quantized cache, the chunk's keys come from them
    unquantized and only the prefix from the (dequantized) pages, as the Triton kernel reads them."""
    # q: [total_q, q_heads, head_dim]; cu_seqlens_q: [batch + 1]; seq_lens: [batch]
    fmt = kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, q.shape[-1])
    quantized = fmt != "auto"
    rows = (k, v) if quantized and k is not None else None
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for i, kv_len in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        paged = kv_len - (hi - lo) if rows else kv_len
        keys = _gather_paged(k_cache, block_tables[i], paged, k_scale, q.dtype if quantized else None, fmt)
        vals = _gather_paged(v_cache, block_tables[i], paged, v_scale, q.dtype if quantized else None, fmt)
        if rows:
            keys, vals = torch.cat((keys, rows[0][lo:hi].to(q.dtype))), torch.cat((vals, rows[1][lo:hi].to(q.dtype)))
        _attend(q[lo:hi], keys, vals, kv_len - (hi - lo), scale, causal, sliding_window, softcap, out[lo:hi])
    return out


def varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, causal=False):
    """Attention within each sequence of a packed batch (vision encoders: one sequence per image)."""
    # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; cu_seqlens: [batch + 1]
    out = torch.empty_like(q)
    starts = cu_seqlens.tolist()
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
        if hi > lo:
            _attend(q[lo:hi], k[lo:hi], v[lo:hi], 0, scale, causal, None, 0.0, out[lo:hi])
    return out
