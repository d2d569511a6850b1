"""y = x W^T (+ b) for the decoder's projections, with a Triton GEMV for the one row of a batch-1 decode step.

A decode step of one sequence multiplies one row by every weight matrix once: the time is the weight read.
cuBLAS's kernels for these shapes read small matrices well under the HBM rate, and each waits for the kernel
before it to end before it starts. The GEMV here gives each program `block_n` rows of W and the whole K. Its first weight tile is loaded before the program waits
for the previous kernel (programmatic dependent launch, sm_90: weights are no kernel's output), so the read
starts while the kernel before it still runs. The products accumulate in fp32 on the CUDA cores (one FMA per
weight element is far under their rate) and the sum is rounded once to the output dtype.

Two or more rows go to torch's GEMM (cuBLAS): this kernel, sweeping its weight tile once per row, is slower than
cuBLAS from two rows on. So does a row launched eagerly on a GPU: an eager decode step is host-bound, and a
Triton launch from Python costs the host more than cuBLAS's. The GEMV runs where a CUDA graph captures it (the
engine's decode steps), whose replays cost the host nothing per kernel, on GPUs with programmatic dependent
launch (sm_90 and newer), and in the interpreter (tests). The reference is `F.linear`. benchmarks/gemv.py and
benchmarks/engine.py measure it; docs/PERF.md#gemv-and-linear has the figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import DeviceInfo, device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.linear"
GEMV_MAX_TOKENS = 1  # rows per call that take the GEMV; more take the GEMM


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int  # rows of W (output columns) per program
    block_k: int  # K elements per loop step
    num_warps: int


def gemv_config(n: int, k: int) -> GemvConfig:
    """The GEMV's tiles for W [n, k]: 8 rows of W per program, read 1024 columns at a time (16 KB in 16-bit
    types; one step covers a shorter K). The first tile each program loads before its dependent-launch wait is
    what the kernel before it hides, so larger first tiles gain in the engine's step. Chosen by
    benchmarks/engine.py and benchmarks/gemv.py; see docs/PERF.md#gemv-and-linear.
    """
    return GemvConfig(8, min(1024, triton.next_power_of_2(k)), 4)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # x: [K]; w: [N, K] (K contiguous); y: [N]. One program: BLOCK_N rows of w, all of K.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    # the first weight tile before the wait: weights are no kernel's output, so their read overlaps the kernel
    # before this one (programmatic dependent launch); x is read and everything stored after the wait
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    launch_next_then_wait(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        k_mask = ks < K
        if k0 > 0:
            w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)  # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv(x, weight, bias=None, out_dtype=None, *, device: DeviceInfo | None = None, config: GemvConfig | None = None):
    """The Triton GEMV for x [1, K] and weight [N, K]; returns [1, N] in `out_dtype` (default x's dtype).
    `config` overrides `gemv_config` (benchmarks sweep it)."""
    tokens, k = x.shape
    n = weight.shape[0]
    if tokens > GEMV_MAX_TOKENS:
        raise ValueError(f"the GEMV takes at most {GEMV_MAX_TOKENS} row; got {tokens}")
    if weight.stride(-1) != 1:
        raise ValueError("the GEMV needs the weight's last (K) dimension contiguous")
    x = x if x.stride(-1) == 1 else x.contiguous()
    device = device or device_for(x)
    out = torch.empty((tokens, n), dtype=out_dtype or x.dtype, device=x.device)
    if tokens == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(tokens, n))
    cfg = config or gemv_config(n, k)
    pdl = dependent_launch(device)
    launch_compiled(_gemv_kernel, (triton.cdiv(n, cfg.block_n),),
        x, weight, bias if bias is not None else weight, out, n, k, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=pdl,
        num_warps=cfg.num_warps, **pdl_options(pdl),
    )  # fmt: skip
    return out


def linear_reference(x, weight, bias=None, out_dtype=None):
    y = F.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def takes_gemv(x) -> bool:
    """Whether `x`'s product runs the GEMV: one row, interpreted (tests), or captured into a CUDA graph on a GPU
    with programmatic dependent launch (sm_90 and newer). The module's docstring says why not eagerly; without
    dependent launch the GEMV loses the head start its gains were measured with, so those GPUs keep cuBLAS."""
    if x.shape[0] > GEMV_MAX_TOKENS:
        return False
    if not x.is_cuda:
        return True
    return torch.cuda.is_current_stream_capturing() and dependent_launch(device_for(x))


def linear_triton(x, weight, bias=None, out_dtype=None):
    # the GEMV for a graph-captured decode step's one row; the GEMM (cuBLAS) otherwise
    if takes_gemv(x):
        return gemv(x, weight, bias, out_dtype)
    return linear_reference(x, weight, bias, out_dtype)


dispatch.register(OP, linear_reference, linear_triton)


def linear(x, weight, bias=None, out_dtype=None):
    """y = x weight^T + bias, in `out_dtype` (default x's dtype).

    Args:
        x: [tokens, in_features].
        weight: [out_features, in_features], same dtype as x.
        bias: optional [out_features].
        out_dtype: the output's dtype (the LM head asks for float32 logits).
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear expects x [tokens, K] and weight [N, K]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"linear expects x and weight of one dtype; got {x.dtype} and {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}]; got {tuple(bias.shape)}")
    return dispatch.get_impl(OP, x.dtype, device_for(x))(x, weight, bias, out_dtype)
