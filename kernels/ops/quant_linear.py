"""y = x W^T (+ b) with W stored as 4-bit integers in groups along K (W4A16): the weight is dequantized inside the
GEMM, never written out in 16 bits.

Storage (the one layout every 4-bit checkpoint format is converted to at load, llm/quantization.py):
- qweight: [K // 8, N] int32; nibble j (bits 4j..4j+3) of qweight[r, n] is the unsigned code q of W[n, 8r + j]
- scales:  [K // group, N] in the activation dtype
- zeros:   [K // group, N] uint8 (0..16), or None for symmetric codes (zero 8)
- g_idx:   [K] int32, the group of each input row (GPTQ act-order), or None: row k is in group k // group
W[n, k] = (q[k, n] - zeros[g, n]) * scales[g, n] with g = g_idx[k] (or k // group).

Two launch shapes of one kernel, chosen by the number of rows M:
- M <= GEMV_MAX_ROWS (decode): a split-k GEMV. Each program takes BLOCK_N output columns and one slice of K; the
  slices' fp32 partial sums are added after the kernel. Splitting K gives a decode step's small N enough programs
  to keep every SM reading weights (the step's time is the weight read).
- More rows (prefill, large batches): a tiled GEMM, one program per [BLOCK_M, BLOCK_N] tile over all of K.
Both dequantize a [BLOCK_K, BLOCK_N] tile of codes in registers (shift, mask, subtract the zero, multiply by the
scale in fp32, round once to the activation dtype) and feed it to tl.dot with an fp32 accumulator. Without g_idx a
K step never crosses a group (BLOCK_K <= group), so one row of scales and zeros serves the whole tile.

Launch tiles come from a per-arch table (`W4A16_CONFIGS`). The reference (`w4a16_reference`) dequantizes the whole
weight to the activation dtype and calls F.linear: the ground truth for the tests and the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.device import DeviceInfo, device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.w4a16_linear"
GEMV_MAX_ROWS = 16  # rows per call that take the split-k GEMV; more take the tiled GEMM
PACK = 8  # 4-bit codes per int32
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class W4Config:
    block_m: int
    block_n: int
    block_k: int  # capped at the group size (a K step stays in one group)
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class W4ArchConfigs:
    gemv: W4Config  # M <= GEMV_MAX_ROWS; block_m 16 (tl.dot's smallest M)
    gemm_small: W4Config  # GEMV_MAX_ROWS < M <= 64
    gemm: W4Config  # M > 64
    waves: int  # GEMV programs per SM the split count aims at


# Per compute capability. sm_70/75 have no cp.async (one or two stages) and 64-96 KB of shared memory; sm_86/89
# have 100 KB per SM, sm_80 164 KB, sm_90 228 KB (deeper pipelines, 128 x 128 GEMM tiles). An unknown newer arch
# takes the closest older entry; the interpreter takes sm_80's.
W4A16_CONFIGS = {
    (7, 0): W4ArchConfigs(W4Config(16, 64, 64, 4, 1), W4Config(32, 64, 32, 4, 1), W4Config(64, 64, 32, 4, 1), 4),
    (7, 5): W4ArchConfigs(W4Config(16, 64, 64, 4, 2), W4Config(32, 64, 32, 4, 2), W4Config(64, 64, 32, 4, 2), 4),
    (8, 0): W4ArchConfigs(W4Config(16, 64, 128, 4, 4), W4Config(64, 64, 64, 4, 3), W4Config(128, 128, 64, 8, 3), 4),
    (8, 6): W4ArchConfigs(W4Config(16, 64, 128, 4, 3), W4Config(64, 64, 64, 4, 2), W4Config(128, 64, 64, 4, 2), 4),
    (8, 9): W4ArchConfigs(W4Config(16, 64, 128, 4, 3), W4Config(64, 64, 64, 4, 2), W4Config(128, 64, 64, 4, 2), 4),
    (9, 0): W4ArchConfigs(W4Config(16, 64, 128, 4, 4), W4Config(64, 128, 64, 4, 4), W4Config(128, 128, 64, 8, 4), 4),
}


def arch_configs(device: DeviceInfo) -> W4ArchConfigs:
    cap = device.capability or (8, 0)
    known = [c for c in W4A16_CONFIGS if c <= cap]
    return W4A16_CONFIGS[max(known)] if known else W4A16_CONFIGS[min(W4A16_CONFIGS)]


def launch_config(m: int, group_size: int, has_g_idx: bool, device: DeviceInfo) -> W4Config:
    """The tiles for M rows; without g_idx the K step is capped at the group size."""
    table = arch_configs(device)
    cfg = table.gemv if m <= GEMV_MAX_ROWS else table.gemm_small if m <= 64 else table.gemm
    if not has_g_idx and cfg.block_k > group_size:
        cfg = W4Config(cfg.block_m, cfg.block_n, group_size, cfg.num_warps, cfg.num_stages)
    return cfg


def split_count(n: int, k: int, cfg: W4Config, sm_count: int, waves: int) -> int:
    """K slices of the GEMV: enough programs for `waves` per SM, each slice at least one K step."""
    tiles = triton.cdiv(n, cfg.block_n)
    steps = triton.cdiv(k, cfg.block_k)
    return max(1, min(steps, triton.cdiv(waves * sm_count, tiles)))


@triton.jit
def _w4a16_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, b_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_os, k_per_split,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # x: [M, K]; qweight: [K // 8, N] int32; scales/zeros: [K // GROUP, N]; out: [splits, M, N] (stride_os apart).
    # Program (pid_n, pid_m, pid_s): a [BLOCK_M, BLOCK_N] tile of the output over K slice pid_s.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    k_begin = pid_s * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [BM, BK]
        # each int32 word read once ([BK // 8, BN]) and unpacked in registers into its 8 rows: row 8 * i + j is
        # nibble j of word i, so [BK // 8, 8, BN] reshaped row-major is [BK, BN] in K order
        offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(
            qw_ptr + offs_w.to(tl.int64)[:, None] * N + offs_n[None, :],
            mask=(offs_w < tl.cdiv(k_end, 8))[:, None] & n_mask[None, :],
            other=0,
        )  # [BK // 8, BN] int32
        shifts = tl.arange(0, 8) * 4
        q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))  # [BK, BN]
        if HAS_GIDX:  # each row its own group: gather the scales (and zeros) per row
            g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
            sz_offs = g.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BK, BN]
            sz_mask = k_mask[:, None] & n_mask[None, :]
        else:  # the K step lies in one group: one row of scales (and zeros) for the tile
            sz_offs = ((k0 // GROUP) * N + offs_n)[None, :]  # [1, BN]
            sz_mask = n_mask[None, :]
        s = tl.load(s_ptr + sz_offs, mask=sz_mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            z = tl.load(z_ptr + sz_offs, mask=sz_mask, other=0).to(tl.int32)
        else:
            z = 8
        w = ((q - z).to(tl.float32) * s).to(x.dtype)  # [BK, BN]
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:  # the first slice carries the bias
        bias = tl.load(b_ptr + offs_n, mask=n_mask & (pid_s == 0), other=0.0).to(tl.float32)
        acc += bias[None, :]
    out = out_ptr + pid_s * stride_os + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def w4a16_triton(x, qweight, scales, zeros, g_idx, group_size, bias=None, *, config: W4Config | None = None,
                 splits: int | None = None):  # fmt: skip
    """The Triton W4A16 product. `config` and `splits` override the per-arch choice (tests and benchmarks)."""
    m, k = x.shape
    n = qweight.shape[1]
    x = x if x.stride(-1) == 1 else x.contiguous()
    device = device_for(x)
    cfg = config or launch_config(m, group_size, g_idx is not None, device)
    if g_idx is None and group_size % cfg.block_k:
        raise ValueError(f"without g_idx a K step must lie in one group: block_k {cfg.block_k}, group {group_size}")
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m <= GEMV_MAX_ROWS:
        table = arch_configs(device)
        splits = splits or split_count(n, k, cfg, device.sm_count, table.waves)
    else:
        splits = splits or 1
    k_per_split = triton.cdiv(triton.cdiv(k, splits), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)  # no empty slice
    out = torch.empty((splits, m, n), dtype=x.dtype if splits == 1 else torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), splits)
    launch_compiled(_w4a16_kernel, grid,
        x, qweight, scales, zeros if zeros is not None else qweight, g_idx if g_idx is not None else qweight,
        bias if bias is not None else scales, out, m, n, k, x.stride(0), out.stride(1), out.stride(0), k_per_split,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_GIDX=g_idx is not None, HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out[0] if splits == 1 else out.sum(0).to(x.dtype)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """[K // 8, N] int32 -> [K, N] uint8 codes (nibble j of word r is row 8r + j)."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)  # [8]
    codes = (qweight[:, None, :] >> shifts[None, :, None]) & 0xF  # [K // 8, 8, N]
    return codes.reshape(-1, qweight.shape[1]).to(torch.uint8)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[K, N] codes in 0..15 -> [K // 8, N] int32 (the inverse of unpack_int4; K a multiple of 8)."""
    k, n = codes.shape
    if k % PACK:
        raise ValueError(f"pack_int4 needs K a multiple of {PACK}; got {k}")
    grouped = codes.to(torch.int64).reshape(k // PACK, PACK, n)  # [K // 8, 8, N]
    shifts = torch.arange(0, 32, 4, device=codes.device, dtype=torch.int64)
    words = (grouped << shifts[None, :, None]).sum(1)  # [K // 8, N] in 0..2^32-1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_w4(qweight, scales, zeros, g_idx, group_size, dtype=None) -> torch.Tensor:
    """The weight [N, K] the stored codes stand for, computed in fp32 and rounded once to `dtype`
    (default the scales')."""
    codes = unpack_int4(qweight).to(torch.float32)  # [K, N]
    k = codes.shape[0]
    groups = g_idx.long() if g_idx is not None else torch.arange(k, device=codes.device) // group_size
    zero = zeros[groups].to(torch.float32) if zeros is not None else 8.0
    w = (codes - zero) * scales[groups].to(torch.float32)  # [K, N]
    return w.T.to(dtype or scales.dtype)


def w4a16_reference(x, qweight, scales, zeros, g_idx, group_size, bias=None):
    return F.linear(x, dequantize_w4(qweight, scales, zeros, g_idx, group_size, x.dtype), bias)


dispatch.register(OP, w4a16_reference, w4a16_triton)


def w4a16_linear(x, qweight, scales, zeros, g_idx, group_size, bias=None):
    """y = x W^T + bias with W held as 4-bit codes (the module docstring gives the layout).

    Args:
        x: [tokens, K] fp16, bf16 or fp32.
        qweight: [K // 8, N] int32.
        scales: [K // group_size, N], x's dtype.
        zeros: [K // group_size, N] uint8, or None (symmetric: zero 8).
        g_idx: [K] int32 group of each input row, or None (row k in group k // group_size).
        group_size: 32, 64 or 128.
        bias: optional [N].

    Returns:
        [tokens, N] in x's dtype.
    """
    if x.dim() != 2 or qweight.dim() != 2 or x.shape[1] != qweight.shape[0] * PACK:
        raise ValueError(f"w4a16_linear expects x [tokens, K] and qweight [K // 8, N]; got {tuple(x.shape)}, "
                         f"{tuple(qweight.shape)}")  # fmt: skip
    k, n = x.shape[1], qweight.shape[1]
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32; got {qweight.dtype}")
    if group_size not in GROUP_SIZES or k % group_size:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} and divide K={k}; got {group_size}")
    if scales.shape != (k // group_size, n) or scales.dtype != x.dtype:
        raise ValueError(f"scales must be [{k // group_size}, {n}] in {x.dtype}; got {tuple(scales.shape)} "
                         f"{scales.dtype}")  # fmt: skip
    if zeros is not None and (zeros.shape != scales.shape or zeros.dtype != torch.uint8):
        raise ValueError(f"zeros must be uint8 shaped like the scales; got {tuple(zeros.shape)} {zeros.dtype}")
    if g_idx is not None and g_idx.shape != (k,):
        raise ValueError(f"g_idx must be [{k}]; got {tuple(g_idx.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be [{n}]; got {tuple(bias.shape)}")
    impl = dispatch.get_impl(OP, x.dtype, device_for(x))
    return impl(x, qweight, scales, zeros, g_idx, group_size, bias)
