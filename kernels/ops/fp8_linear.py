"""y = x W^T (+ b) in FP8 (W8A8): W held as float8_e4m3fn [N, K] with one fp32 scale per output row, x quantized
per row (token) to float8_e4m3fn on the fly, the product on FP8 tensor cores where the GPU has them (sm_89, sm_90
and newer): up to GEMV_ROWS rows (decode) a split-k Triton GEMV (`_fp8_gemv_kernel`: the weight read is the
time, and torch._scaled_mm's tiles, its bf16-only output and the cast after it cost more than the read at one
row), more rows torch._scaled_mm. The GEMV runs up to MAX_GEMV_ROWS rows (one tile of x's rows) for the
benchmark that places GEMV_ROWS.

Activation quantization (both implementations): s_x = max|x_row| / 448 (448 is e4m3's largest finite value; a zero
row takes s_x = 1), x_q = fp8(x / s_x). Then y[m, n] = s_x[m] * s_w[n] * sum_k x_q[m, k] * W_q[n, k] + b[n].
The reference computes that sum in fp32 from the same fp8 values (the CPU path and the ground truth);
torch._scaled_mm accumulates in fp32 on the tensor cores and writes bf16 (its row-wise scaling writes no other type),
rounded to x's dtype after. The GEMV sums the same FP8 products in fp32 on the tensor cores (Triton multiplies
e4m3 operands directly where the tile suits the FP8 MMA, else as their exact fp16 values), scales them and writes
x's dtype (and the bias) itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import DeviceInfo, device_for
from vlchat.kernels.launch import launch_compiled
from vlchat.kernels.ops.quant_linear import finish_split_k, split_k_program, split_plan

OP = "ops.fp8_linear"
GEMV_ROWS = 128  # rows up to which the GPU implementation takes the GEMV (it beat _scaled_mm at 128 on the H100)
MAX_GEMV_ROWS = 128
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 rows, fp32 scales [rows, 1]) of x [rows, K] with each row's largest magnitude at FP8_MAX."""
    scale = x.abs().amax(dim=-1, keepdim=True).to(torch.float32) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@triton.jit
def _row_scale(amax, FP8_MAX: tl.constexpr):
    scale = tl.max(amax, axis=0) / FP8_MAX
    return tl.where(scale > 0, scale, 1.0)  # a zero row keeps a finite scale


@triton.jit
def _store_codes(q_ptrs, x, scale, mask, FP8_MAX: tl.constexpr):
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)  # div_rn: torch's correctly rounded division
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row: its largest magnitude over K, then the row divided by its scale (quantize_rows' math).
    # A row of at most BLOCK values is loaded once and kept in registers (one memory round trip, where a loop
    # over K blocks would wait for one per block and pass).
    row = tl.program_id(0).to(tl.int64)
    x_row, q_row = x_ptr + row * stride_x, q_ptr + row * stride_q
    if BLOCK >= K:
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        scale = _row_scale(tl.abs(x), FP8_MAX)
        tl.store(s_ptr + row, scale)
        _store_codes(q_row + offs, x, scale, offs < K, FP8_MAX)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)))
        scale = _row_scale(amax, FP8_MAX)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            _store_codes(q_row + offs, x, scale, offs < K, FP8_MAX)


ROW_BLOCK = 16384  # the longest row quantized in one pass (16 warps: 32 values a thread)


def quantize_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows in one launch (the torch expression is eight kernels, per linear layer of every step)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = min(triton.next_power_of_2(k), ROW_BLOCK)
        launch_compiled(_quantize_rows_kernel, (rows,), x, q, scale, k, x.stride(0), q.stride(0),
                        FP8_MAX=FP8_MAX, BLOCK=block, num_warps=min(16, max(4, block // 1024)))  # fmt: skip
    return q, scale


@dataclass(frozen=True, slots=True)
class Fp8GemvConfig:
    """The FP8 GEMV's tiles: block_n weight rows by block_k per step, against all rows of x (padded to 16 or the
    next power of two)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    waves: int  # programs per SM the split count aims at


# One table for sm_89 and sm_90 (the arches with FP8 tensor cores): the fastest tiles over a 7B layer's four
# projections (benchmarks/fp8_gemv_tune.py; docs/PERF.md#fp8-w8a8). Up to 16 rows of x: 32 weight rows by 512 of K
# a step in three stages, two programs per SM (fewer, longer K slices beat more programs: each slice's partial and
# the reduction cost a round trip); up to 64 rows 64 x 256, one program per SM; up to 128 rows 64 x 128 in four
# stages, one program per SM.
FP8_GEMV = Fp8GemvConfig(32, 512, 4, 3, 2)
FP8_GEMV_MID = Fp8GemvConfig(64, 256, 4, 3, 1)
FP8_GEMV_WIDE = Fp8GemvConfig(64, 128, 4, 4, 1)


def gemv_config(rows: int) -> Fp8GemvConfig:
    return FP8_GEMV if rows <= 16 else FP8_GEMV_MID if rows <= 64 else FP8_GEMV_WIDE


@triton.jit
def _fp8_gemv_kernel(
    xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    k_per_split, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # xq: [M, K] fp8, xs: [M] fp32; w: [N, K] fp8, ws: [N] fp32; out: [M, N]; part/count: finish_split_k's.
    # Program (pid_n, pid_s): BLOCK_N weight rows over K slice pid_s, as [BN, BK] x [BK, BM] dots of FP8 values (the
    # weight tile is the MMA's row side; x's rows, padded to BLOCK_M >= 16, the narrow one).
    pid_n, pid_s, splits, offs_m, offs_n, m_mask, n_mask, k_begin, k_end = split_k_program(
        M, N, K, k_per_split, BLOCK_M, BLOCK_N)  # fmt: skip
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_begin + offs_k)[None, :]  # [BN, BK]
    x_ptrs = xq_ptr + offs_m[None, :] * stride_xm + (k_begin + offs_k)[:, None]  # [BK, BM]
    launch_next_then_wait(PDL)  # x is the quantizing kernel's output
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k_mask = k0 + offs_k < k_end
        w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=k_mask[:, None] & m_mask[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    ws = tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)
    xs = tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)
    acc = tl.trans(acc * xs[None, :] * ws[:, None])  # [BM, BN], the reference's order: sum, x's scale, W's
    finish_split_k(acc, pid_n, pid_s, splits, offs_m, offs_n, M, N, stride_om, b_ptr, out_ptr, part_ptr, count_ptr,
                   HAS_BIAS, SPLIT, CHUNK, BLOCK_M, BLOCK_N)


def fp8_gemv(x, weight, weight_scale, bias=None, *, config: Fp8GemvConfig | None = None, splits: int | None = None):
    """fp8_linear for up to MAX_GEMV_ROWS rows: x quantized per row (one launch), then the split-k FP8 GEMV (one
    launch, the bias added and x's dtype written in it). `config` and `splits` override the tiles (tests,
    benchmarks)."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_GEMV_ROWS:
        raise ValueError(f"the FP8 GEMV takes at most {MAX_GEMV_ROWS} rows; got {m}")
    config = config or gemv_config(m)
    block_m = max(16, triton.next_power_of_2(m))
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    x_q, x_scale = quantize_rows_triton(x)
    device = device_for(x)
    plan = split_plan(x, n, config, block_m, splits, device.sm_count)
    pdl = dependent_launch(device)
    launch_compiled(_fp8_gemv_kernel, (plan.tiles, plan.splits),
        x_q, x_scale, weight, weight_scale, bias if bias is not None else weight_scale, plan.out, plan.part,
        plan.counters, m, n, k, x_q.stride(0), weight.stride(0), plan.out.stride(0), plan.k_per_split,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT=plan.splits > 1, CHUNK=plan.chunk, PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl_options(pdl),
    )  # fmt: skip
    return plan.out


def fp8_reference(x, weight, weight_scale, bias=None):
    x_q, x_scale = quantize_rows(x)
    y = (x_q.to(torch.float32) @ weight.to(torch.float32).T) * x_scale * weight_scale[None, :]
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def fp8_scaled_mm(x, weight, weight_scale, bias=None):
    if x.shape[1] % 16 or weight.shape[0] % 16:  # _scaled_mm's tiles
        return fp8_reference(x, weight, weight_scale, bias)
    x_q, x_scale = quantize_rows_triton(x)
    y = torch._scaled_mm(x_q, weight.T, scale_a=x_scale, scale_b=weight_scale[None, :], out_dtype=torch.bfloat16)
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def fp8_tensor_cores(x, weight, weight_scale, bias=None):
    """The GPU implementation: the GEMV up to GEMV_ROWS rows, torch._scaled_mm above."""
    if x.shape[0] <= GEMV_ROWS:
        return fp8_gemv(x, weight, weight_scale, bias)
    return fp8_scaled_mm(x, weight, weight_scale, bias)


def scaled_mm_can_run(device: DeviceInfo, dtype: torch.dtype) -> str | None:
    if not device.is_cuda or device.capability < (8, 9):
        return f"FP8 tensor cores need sm_89 or newer; {device.arch} has none"
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no _scaled_mm"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {dtype} is not supported"
    return None


dispatch.register(OP, fp8_reference, fp8_tensor_cores, can_run=scaled_mm_can_run)


def fp8_linear(x, weight, weight_scale, bias=None):
    """y = x W^T + bias with W in FP8 and x quantized per row (the module docstring gives the arithmetic).

    Args:
        x: [tokens, K] fp16, bf16 or fp32.
        weight: [N, K] float8_e4m3fn.
        weight_scale: [N] fp32, the scale of each row of W.
        bias: optional [N].

    Returns:
        [tokens, N] in x's dtype.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"fp8_linear expects x [tokens, K] and weight [N, K]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight.dtype != FP8:
        raise ValueError(f"the weight must be {FP8}; got {weight.dtype}")
    if weight_scale.shape != (weight.shape[0],) or weight_scale.dtype != torch.float32:
        raise ValueError(f"weight_scale must be [{weight.shape[0]}] float32; got {tuple(weight_scale.shape)} "
                         f"{weight_scale.dtype}")  # fmt: skip
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}]; got {tuple(bias.shape)}")
    return dispatch.get_impl(OP, x.dtype, device_for(x))(x, weight, weight_scale, bias)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 [N, K], fp32 scales [N]) of a 16/32-bit weight [N, K], each row's largest magnitude at FP8_MAX."""
    q, scale = quantize_rows(w)
    return q, scale[:, 0]
