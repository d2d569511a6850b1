"""Gated activations of the decoder MLP: SiLU-and-mul (SwiGLU) and tanh-GELU-and-mul (GeGLU); CLIP's QuickGELU.

Gated input rows hold `[gate | up]` (the fused gate_up projection); the output is
`act(gate) * up`. The references round like transformers (activation in the
input dtype, then the product); the kernels compute in fp32 and round once.
QuickGELU (x * sigmoid(1.702 x), the CLIP and Qwen2-VL vision MLPs') is one pass
over its input instead of torch's three (scale, sigmoid, product).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

SILU = "ops.silu_and_mul"
GELU_TANH = "ops.gelu_tanh_and_mul"
QUICK_GELU = "ops.quick_gelu"
BLOCK = 1024


def silu_and_mul_reference(x):
    # x: [tokens, 2 * inter] -> [tokens, inter]
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(x):
    # x: [tokens, 2 * inter] -> [tokens, inter]
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def quick_gelu_reference(x):
    return x * torch.sigmoid(1.702 * x)


@triton.jit
def _tanh(x):
    # tanh through exp, stable for large |x| (exp(-2|x|) underflows to 0, giving +-1)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _act_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, inter, ACT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    launch_next_then_wait(PDL)  # a GEMV after it starts reading its weights; x is the previous kernel's output
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == "silu":
        act = gate / (1.0 + tl.exp(-gate))
    else:  # gelu with the tanh approximation
        act = 0.5 * gate * (1.0 + _tanh(0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)))
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def _act_and_mul_triton(x, act):
    tokens, width = x.shape
    inter = width // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens > 0 and inter > 0:
        grid = (tokens, triton.cdiv(inter, BLOCK))
        pdl = dependent_launch(device_for(x))
        launch_compiled(_act_and_mul_kernel, grid,
            x, out, x.stride(0), out.stride(0), inter, ACT=act, BLOCK=BLOCK, PDL=pdl, num_warps=4, **pdl_options(pdl),
        )  # fmt: skip
    return out


@triton.jit
def _quick_gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # x * sigmoid(1.702 x); for x -> -inf the exp overflows to inf and the quotient is -0
    y = x / (1.0 + tl.exp(-1.702 * x))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def quick_gelu_triton(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        launch_compiled(_quick_gelu_kernel, (triton.cdiv(x.numel(), BLOCK),), x, out, x.numel(), BLOCK=BLOCK,
                        num_warps=4)  # fmt: skip
    return out


def silu_and_mul_triton(x):
    return _act_and_mul_triton(x, "silu")


def gelu_tanh_and_mul_triton(x):
    return _act_and_mul_triton(x, "gelu_tanh")


dispatch.register(SILU, silu_and_mul_reference, silu_and_mul_triton)
dispatch.register(GELU_TANH, gelu_tanh_and_mul_reference, gelu_tanh_and_mul_triton)
dispatch.register(QUICK_GELU, quick_gelu_reference, quick_gelu_triton)


def _check(x, name):
    if x.dim() != 2 or x.shape[-1] % 2:
        raise ValueError(f"{name} expects x [tokens, 2 * inter]; got {tuple(x.shape)}")


def silu_and_mul(x):
    """SwiGLU: silu(x[:, :inter]) * x[:, inter:] for x [tokens, 2 * inter] -> [tokens, inter]."""
    _check(x, "silu_and_mul")
    return dispatch.get_impl(SILU, x.dtype, device_for(x))(x)


def gelu_tanh_and_mul(x):
    """GeGLU: gelu_tanh(x[:, :inter]) * x[:, inter:] for x [tokens, 2 * inter] -> [tokens, inter]."""
    _check(x, "gelu_tanh_and_mul")
    return dispatch.get_impl(GELU_TANH, x.dtype, device_for(x))(x)


def quick_gelu(x):
    """x * sigmoid(1.702 x) elementwise, any shape."""
    return dispatch.get_impl(QUICK_GELU, x.dtype, device_for(x))(x)
