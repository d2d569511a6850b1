"""act(x @ weight.T + bias) in one GEMM: the vision MLPs' fc1 with its activation in the epilogue.

A vision tower's fc1 writes its widest activation ([tokens, 4 x hidden]) and the activation kernel reads and
writes it again; here the bias and the activation are applied to the fp32 accumulator and the tile is rounded
and stored once. The tile loads and the store are TMA descriptors (16-byte-aligned rows), pipelined over K.

Runs only where `GEMM_ACT` has a config for the arch (tiles measured against cuBLAS plus the separate activation
kernel: benchmarks/linear_act.py); elsewhere, for fewer than `MIN_ROWS` rows and for K above `MAX_K`,
`linear_act` is F.linear followed by the activation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

ACTS = ("quick_gelu", "gelu", "gelu_tanh", "silu", "relu", "none")


class GemmConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    group_m: int = 8  # row tiles walked together per column band (L2 reuse of the weight tiles)


# per compute-capability major; an arch without an entry keeps cuBLAS and the activation kernel. sm_90: the fastest
# of benchmarks/linear_act.py's grid at CLIP-L's and Qwen2-VL's fc1 shapes, ahead of cuBLAS + activation on both
# (benchmarks/vision_tune.py; docs/PERF.md#vision-towers)
GEMM_ACT: dict[int, GemmConfig] = {9: GemmConfig(128, 128, 64, stages=3, warps=4)}
MIN_ROWS = 1024  # below a few row tiles the grid cannot fill the GPU; cuBLAS picks better tiles there
# the widest K the tiles were measured ahead at (CLIP's 1024, Qwen2-VL's 1280): the kernel runs below cuBLAS's rate,
# so its loss grows with K while the activation pass it saves does not (InternViT-6B's 3200 would lose)
MAX_K = 1280


def torch_act(y: torch.Tensor, act: str) -> torch.Tensor:
    """The activation `act` in torch (in y's dtype)."""
    if act == "quick_gelu":
        return y * torch.sigmoid(1.702 * y)
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if act == "silu":
        return F.silu(y)
    if act == "relu":
        return F.relu(y)
    return y


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """The unfused form: the product rounded to x's dtype, then the activation (as the HF towers compute)."""
    return torch_act(F.linear(x, weight, bias), act)


@triton.jit
def _activate(y, ACT: tl.constexpr):
    # y fp32; the same formulas as the torch activations, evaluated once in fp32
    if ACT == "quick_gelu":
        y = y / (1.0 + tl.exp(-1.702 * y))
    elif ACT == "gelu":
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        t = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        e = tl.exp(-2.0 * tl.abs(t))
        th = (1.0 - e) / (1.0 + e)
        y = 0.5 * y * (1.0 + tl.where(t >= 0, th, -th))
    elif ACT == "silu":
        y = y / (1.0 + tl.exp(-y))
    elif ACT == "relu":
        y = tl.maximum(y, 0.0)
    return y


@triton.jit
def _linear_act_kernel(
    x_desc, w_desc, out_desc, bias_ptr, M, N, K,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # grouped tile order: GROUP_M row tiles share each column band, so a band's weight tiles stay in L2
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        a = x_desc.load([off_m, k])
        b = w_desc.load([off_n, k])
        acc = tl.dot(a, b.T, acc)
    if HAS_BIAS:
        cols = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out_desc.store([off_m, off_n], _activate(acc, ACT).to(out_desc.dtype))


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def linear_act_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str, config: GemmConfig
) -> torch.Tensor:
    """The fused kernel for x [M, K], weight [N, K] (rows and both row strides 16-byte aligned)."""
    M, K = x.shape
    N = weight.shape[0]
    x = x.contiguous()
    weight = weight.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    launch_compiled(_linear_act_kernel, grid,
        _descriptor(x, [bm, bk]), _descriptor(weight, [bn, bk]), _descriptor(out, [bm, bn]),
        bias if bias is not None else out, M, N, K,
        ACT=act, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m,
        STAGES=config.stages, num_warps=config.warps,
    )  # fmt: skip
    return out


def fused_config(x: torch.Tensor, weight: torch.Tensor) -> GemmConfig | None:
    """The config the fused kernel runs with for these operands, or None where linear_act takes cuBLAS."""
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16) or weight.dtype != x.dtype:
        return None
    info = device_for(x)
    if not info.is_cuda or info.capability is None or x.shape[0] < MIN_ROWS or x.shape[1] > MAX_K:
        return None
    if (x.shape[1] * x.element_size()) % 16 or (weight.shape[0] * x.element_size()) % 16:
        return None  # TMA rows must be 16-byte multiples
    return GEMM_ACT.get(info.capability[0])


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """act(x @ weight.T + bias) for x [..., K], weight [N, K]: one fused GEMM where the arch has a measured
    config, else F.linear and then the activation (`act` one of ACTS)."""
    if act not in ACTS:
        raise ValueError(f"linear_act: activation {act!r} is not fused; fused: {', '.join(ACTS)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    config = fused_config(x2, weight)
    if config is None:
        from vlchat.kernels.ops.activation import quick_gelu

        y = F.linear(x, weight, bias)
        return quick_gelu(y) if act == "quick_gelu" else torch_act(y, act)
    return linear_act_triton(x2, weight, bias, act, config).reshape(*lead, weight.shape[0])
