"""Paged decode attention with split-k (flash decoding) in Triton.

One program per (KV head, sequence, split), KV heads varying fastest in the
launch order: the CTAs resident together are then the KV heads of a few
sequences, reading adjacent rows of the same pages (a token's rows for all KV
heads are adjacent in the cache; faster than sequences-first on grids of many
waves: docs/PERF.md#decode-configs-per-arch). The query heads sharing the KV head are packed as the
rows of one tile (padded to 16, the smallest tl.dot), the split's share of the
context is streamed in BLOCK_N-token chunks through the block table, and the
result is either written directly (one split) or as an fp32 partial output plus
its log-sum-exp (base 2), merged by `_reduce_kernel`. On sm_90 the warp-specialized
Gluon kernel of `decode_ws.py` runs instead where the arch table has a config for it
(`plan.decode_plan` decides which grids); it writes the same partials.

Each sequence divides its own visible range [max(0, len - window), len) among
the splits on the device, so the launch depends only on host-known integers
(batch, heads, split count): CUDA-graph safe. Empty splits write lse = -inf and
contribute nothing; a sequence with no visible key gets zeros, never NaN.

KV cache layout: [num_blocks, block_size, kv_heads, head_dim] with head_dim
contiguous; a token's row for one KV head is head_dim contiguous elements.

Programmatic dependent launch (where the arch table's `pdl` holds: sm_90): the
decode kernel is launched while the kernel before it (the KV write, in a decode
step) still runs, loads its sequence length (and, in the Gluon kernel, the first
tiles' pages and the split's first tile: `decode_ws.py`) and then waits
(griddepcontrol.wait) before reading q and the rest of the cache. The Gluon kernel
lets the reduce kernel launch once each of its CTAs has started its last tile (a
split of one tile: at its end; `decode_ws.py` says why then); the reduce
kernel lets the next kernel launch at its start, waits before reading the partials,
and prefers the largest shared-memory carveout, so that the next decode's CTAs can
start beside it (`carveout.py`). tests/kernels/sm90_ptx.py checks the compiled order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels.attention import carveout, decode_ws, kv_quant, plan
from vlchat.kernels.attention.configs import DecodeConfig, WsDecodeConfig, check_dtype, table_for
from vlchat.kernels.attention.gluon_sm90 import LOG2E
from vlchat.kernels.attention.pdl import dependent_launch, gdc_wait, launch_next_then_wait, pdl_options
from vlchat.kernels.device import TritonMode, device_for
from vlchat.kernels.launch import launch_compiled

_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _tanh(x):
    # tanh through exp2, saturating cleanly at +-1 for large |x| (no libdevice: runs in the interpreter too)
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * _LOG2E)) + 1.0)


@triton.jit
def fp8_to_half(bits):
    """e4m3 bits (uint8) -> float16 holding the value * 2**-8 (kv_quant.FP8_HALF_FACTOR): the exponent and
    mantissa fields moved into a float16's, exact for every finite e4m3 value, subnormals included."""
    h = bits.to(tl.uint16)
    h = ((h & 0x7F) << 7) | ((h & 0x80) << 8)
    return h.to(tl.float16, bitcast=True)


@triton.jit
def dequant_tile(x, sz_rows, n_ok, offs_d, dtype, QUANT: tl.constexpr):
    """A loaded K/V tile x [BLOCK_N, BLOCK_D] as `dtype`: QUANT 0 as is, 1 (fp8) its values * 2**-8 (the caller
    folds 256 * scale in elsewhere), 2 (int8) code * scale + zero with each row's pair at sz_rows [BLOCK_N], 3
    (int4) the same of the nibble dimension offs_d sits in (the tile loaded at byte columns offs_d // 2)."""
    if QUANT == 1:
        return fp8_to_half(x).to(dtype)
    elif QUANT >= 2:
        if QUANT == 3:
            x = (x.to(tl.int32) >> ((offs_d % 2) * 4)[None, :]) & 15
        row_scale = tl.load(sz_rows, mask=n_ok, other=0.0)
        row_zero = tl.load(sz_rows + 1, mask=n_ok, other=0.0)
        return (x.to(tl.float32) * row_scale[:, None] + row_zero[:, None]).to(dtype)
    else:
        return x


@triton.jit
def _codes(x, DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr,
           NATIVE_FP8: tl.constexpr, PRMT: tl.constexpr):  # fmt: skip
    """A K/V tile of a quantized cache as the decode's dot operand, before any scale: fp8 its values (times 2**-8
    unless NATIVE_FP8: fp8_to_half), int8 and int4 INT_OFFSET + code in float16 (the code's byte under 0x64: one
    bit operation, exact; with PRMT, compiled kernels only, two byte permutes make four of them) or the code in
    float32; int4 from the packed tile x [BLOCK_N, BLOCK_D // 2], unpacked to the dimension order (low nibble
    even)."""
    if QUANT == 1:
        if NATIVE_FP8:  # cvt from e4m3, two values an instruction (sm_89+)
            return x.to(tl.float8e4nv, bitcast=True).to(tl.float16).to(DOT)
        return fp8_to_half(x).to(DOT)
    if QUANT == 3:
        x = tl.join(x & 15, x >> 4).reshape(BLOCK_N, BLOCK_D)
    if DOT == tl.float16:
        if PRMT:  # four bytes a register: each byte under 0x64 in its half of the two outputs (selectors 0-3: x's
            # bytes, 4: 0x64)
            return tl.inline_asm_elementwise(
                "prmt.b32 $0, $2, 0x64646464, 0x4140; prmt.b32 $1, $2, 0x64646464, 0x4342;", "=r,=r,r",
                [x], dtype=tl.float16, is_pure=True, pack=4)  # fmt: skip
        return (x.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True)
    return x.to(DOT)


@triton.jit
def _row_pairs(sz_rows, n_ok):
    """The (scale, zero) pairs of a tile's rows [BLOCK_N], loaded as one [BLOCK_N, 2] tile."""
    sz = tl.load(sz_rows[:, None] + tl.arange(0, 2)[None, :], mask=n_ok[:, None], other=0.0)
    return tl.split(sz)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr, ksz_ptr, vsz_ptr,
    scale, softcap, window, num_splits, v_mul,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_tb, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
    stride_sb, stride_st, stride_sh, stride_ub, stride_ut, stride_uh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr, DIRECT: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr, QUANT: tl.constexpr, NATIVE_FP8: tl.constexpr,
    PRMT: tl.constexpr,
):  # fmt: skip
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    if PDL:  # the lengths are the engine's input; q and the cache's new rows are the previous kernel's output
        gdc_wait()

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g  # query heads of this KV head
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    if QUANT == 3:  # int4: the packed tile, two dimensions a byte
        cols = tl.arange(0, BLOCK_D // 2)
        mask_c = cols < HEAD_DIM // 2
    else:
        cols = offs_d
        mask_c = mask_d
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]
    if QUANT > 0 and q.dtype != tl.float32:
        # the dots over a quantized cache run in float16 (int codes need its 11-bit mantissa; bf16 q is clamped)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    INT_OFFSET: tl.constexpr = 1024.0 if q.dtype == tl.float16 else 0.0  # of the int codes (_codes)
    q_sum = tl.sum(q.to(tl.float32), 1)  # [BLOCK_G]: the K zero points' share of the scores
    qk_scale = scale * _LOG2E

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    # the softmax denominators and the V zero points' share of the output, summed over the keys at the end: per
    # (query, key column) until then, which saves two cross-warp reductions an iteration
    l_cols = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    zero_cols = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = tables_ptr + b.to(tl.int64) * stride_tb
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        page = tl.load(table + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k = tl.load(
            k_ptr + (page * stride_kb + slot * stride_kt + kvh * stride_kh)[:, None] + cols[None, :],
            mask=mask_n[:, None] & mask_c[None, :],
            other=0,
        )  # [BLOCK_N, BLOCK_D] (int4: [BLOCK_N, BLOCK_D // 2])
        if QUANT > 0:
            k = _codes(k, q.dtype, BLOCK_N, BLOCK_D, QUANT, NATIVE_FP8, PRMT)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_G, BLOCK_N] fp32
        if QUANT >= 2:  # q . (code * scale + zero) = scale * (q . code) + zero * sum(q)
            k_a, k_z = _row_pairs(ksz_ptr + page * stride_sb + slot * stride_st + kvh * stride_sh, mask_n)
            s = s * k_a[None, :] + (k_z - INT_OFFSET * k_a)[None, :] * q_sum[:, None]
        if SOFTCAP:
            s = _tanh(s * (scale / softcap)) * (softcap * _LOG2E)
        else:
            s = s * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every chunk holds a visible key
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_cols = l_cols * alpha[:, None] + p
        v = tl.load(
            v_ptr + (page * stride_vb + slot * stride_vt + kvh * stride_vh)[:, None] + cols[None, :],
            mask=mask_n[:, None] & mask_c[None, :],
            other=0,
        )  # [BLOCK_N, BLOCK_D] (int4: [BLOCK_N, BLOCK_D // 2])
        if QUANT >= 2:
            # p @ (code * scale + zero) = big * (w @ code) + p @ zero, w = p * scale / big (big: the tile's largest
            # scale, so that w keeps p's range in float16); the codes' offset comes off through w's rounded values
            v_a, v_z = _row_pairs(vsz_ptr + page * stride_ub + slot * stride_ut + kvh * stride_uh, mask_n)
            big = tl.max(v_a, 0)
            big = tl.where(big > 0, big, 1.0)
            w = (p * (v_a / big)[None, :]).to(q.dtype)
            zero_cols = zero_cols * alpha[:, None] + (p * v_z[None, :] - (INT_OFFSET * big) * w.to(tl.float32))
            pv = tl.dot(w, _codes(v, q.dtype, BLOCK_N, BLOCK_D, QUANT, NATIVE_FP8, PRMT), input_precision=PRECISION)
            acc = acc * alpha[:, None] + big * pv
        else:
            if QUANT == 1:
                v = _codes(v, q.dtype, BLOCK_N, BLOCK_D, QUANT, NATIVE_FP8, PRMT)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    l_i = tl.sum(l_cols, 1)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    if QUANT >= 2:
        acc += tl.sum(zero_cols, 1)[:, None]
    o = acc / safe_l[:, None]
    if QUANT == 1:
        o = o * v_mul
    store_mask = mask_g[:, None] & mask_d[None, :]
    if DIRECT:
        dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        row = b * stride_pb + heads * stride_ph + split * stride_ps
        tl.store(part_ptr + row[:, None] + offs_d[None, :], o, mask=store_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(lse_ptr + (b * tl.num_programs(0) * GROUP + heads) * num_splits + split, lse, mask=mask_g)


@triton.jit
def _reduce_kernel(
    part_ptr, lse_ptr, out_ptr, num_splits,
    stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    launch_next_then_wait(PDL)  # the partials are the decode kernel's output
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    lse = tl.load(lse_ptr + (b * tl.num_programs(1) + h) * num_splits + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty: weights 0, output 0
    w = tl.exp2(lse - m)  # [BLOCK_S]
    denom = tl.sum(w, 0)
    denom = tl.where(denom > 0, denom, 1.0)
    part = tl.load(
        part_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=mask_s[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    o = tl.sum(part * w[:, None], 0) / denom
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def _check(q, k_cache, v_cache, block_tables, seq_lens):
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "q must be [batch, q_heads, head_dim]; k/v caches [num_blocks, block_size, kv_heads, head_dim]"
        )
    batch, q_heads, head_dim = q.shape
    fmt = kv_quant.cache_format(k_cache, head_dim)
    if k_cache.shape[3] != kv_quant.storage_dim(fmt, head_dim) or q_heads % k_cache.shape[2]:
        raise ValueError(f"head_dim/heads mismatch: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
    quantized = fmt != "auto"
    if (not quantized and q.dtype != k_cache.dtype) or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"q and the caches must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension of q and the caches must be contiguous")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("block_tables and seq_lens must be int32")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or seq_lens.shape != (batch,):
        raise ValueError("block_tables must be [batch, max_blocks] and seq_lens [batch]")


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window=None, num_splits=None, out=None, softcap=0.0,
    *, device=None, config: DecodeConfig | WsDecodeConfig | None = None, cache_memo: dict | None = None,
    k_scale=None, v_scale=None,
):  # fmt: skip
    """Paged decode; `device` overrides the arch table (tests run other archs' configs) and `config` the plan's
    config (the engine passes the one its split count was planned with; tests pick one), else plan.decode_plan picks
    the config (and the split count when `num_splits` is None). A WsDecodeConfig runs the Gluon kernel where
    `decode_ws.available` and `supports` the call, else the Triton config decode_plan pairs with the same split
    count (plan.triton_config). `cache_memo`: a dict the caches' owner keeps with them (and empties when it
    replaces them), where the Gluon kernel keeps their TMA descriptors (gluon_sm90.row_descriptor).
    Quantized caches (kv_quant.py; k_scale/v_scale as their format takes them) run the Triton kernel, which turns
    each tile's codes into float16 in registers and applies the int formats' per-row scales and zero points to the
    scores and to the probabilities rather than to every element (_decode_kernel); the plan gives them Triton
    configs only, with twice the keys a tile (configs.quantized_tiles)."""
    # q: [batch, q_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim]
    _check(q, k_cache, v_cache, block_tables, seq_lens)
    fmt = kv_quant.check_scales(k_cache, v_cache, k_scale, v_scale, q.shape[-1])
    device = device or device_for(q)
    check_dtype(table_for(device), q.dtype)
    num_splits = None if num_splits is None else max(1, int(num_splits))
    if config is None:
        num_splits, config = plan.decode_plan(q, k_cache, block_tables, device, num_splits)
    elif num_splits is None:
        num_splits = plan.decode_splits(q, k_cache, block_tables, device, config)
    batch, q_heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if isinstance(config, WsDecodeConfig) and not (
        decode_ws.available(device, group, page) and decode_ws.supports(q, k_cache, v_cache, softcap)
    ):
        config = plan.triton_config(device, q, k_cache, block_tables, num_splits)
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    direct = num_splits == 1
    if direct:
        part, lse = out, out  # unused
        part_strides = (0, 0, 0)
    else:
        part = torch.empty(batch, q_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
        lse = torch.empty(batch, q_heads, num_splits, device=q.device, dtype=torch.float32)
        part_strides = part.stride()[:3]
    pdl = dependent_launch(device)
    if isinstance(config, WsDecodeConfig):
        decode_ws.launch(
            q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, num_splits, out, part, lse, config,
            pdl, cache_memo,
        )  # fmt: skip
    else:
        native_fp8 = table_for(device).native_fp8
        k_mul, v_mul, ksz, vsz, sz_strides = _quant_args(fmt, k_cache, k_scale, v_scale, native_fp8)
        if fmt == "fp8":
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        launch_compiled(_decode_kernel, (kv_heads, batch, num_splits),
            q, k_cache, v_cache, block_tables, seq_lens, out, part, lse, ksz, vsz,
            float(scale * k_mul), float(softcap or 1.0), int(sliding_window or 0), num_splits, float(v_mul),
            q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
            block_tables.stride(0), out.stride(0), out.stride(1), *part_strides, *sz_strides,
            GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            PAGE=page, BLOCK_N=config.block_n, SOFTCAP=bool(softcap and softcap > 0), DIRECT=direct,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PDL=pdl, QUANT=kv_quant.QUANT_CODES[fmt],
            NATIVE_FP8=native_fp8, PRMT=device.triton == TritonMode.COMPILED, num_warps=config.num_warps,
            num_stages=config.num_stages, **pdl_options(pdl),
        )  # fmt: skip
    if not direct:
        reduce_partials(part, lse, out, pdl)
    return out


def _quant_args(fmt: str, k_cache, k_scale, v_scale, native_fp8: bool = False):
    """(multiplier folded into the score scale, multiplier of the output, K and V scale/zero tensors, their strides)
    for a cache of format `fmt`: fp8 tiles convert to their values * 2**-8 (to their values with `native_fp8`: the
    decode kernel's NATIVE_FP8), the factor and the per-tensor scales come back through the multipliers; int8 and
    int4 tiles read their rows' scale/zero pairs."""
    if fmt == "fp8":
        factor = 1.0 if native_fp8 else kv_quant.FP8_HALF_FACTOR
        return factor * kv_quant.fp8_scale(k_scale), factor * kv_quant.fp8_scale(v_scale), k_cache, k_cache, (0,) * 6
    if fmt in kv_quant.LEVELS:
        return 1.0, 1.0, k_scale, v_scale, (*k_scale.stride()[:3], *v_scale.stride()[:3])
    return 1.0, 1.0, k_cache, k_cache, (0,) * 6


def reduce_partials(part, lse, out, pdl: bool):
    """Merge the splits' partial outputs part [batch, q_heads, splits, head_dim] and their log-sum-exps lse
    [batch, q_heads, splits] (contiguous) into out [batch, q_heads, head_dim]; returns the launched kernel (Triton's
    CompiledKernel; None under the interpreter)."""
    batch, q_heads, num_splits, head_dim = part.shape
    kernel = launch_compiled(_reduce_kernel, (batch, q_heads),
        part, lse, out, num_splits, *part.stride()[:3], out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        PDL=pdl, num_warps=4, **pdl_options(pdl),
    )  # fmt: skip
    if pdl:  # the next decode's CTAs start beside it (carveout.py)
        carveout.prefer_max_shared(kernel)
    return kernel
