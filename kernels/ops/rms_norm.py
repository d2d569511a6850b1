"""RMSNorm, optionally fused with the residual add before it.

`rms_norm(x, weight, eps)` normalises each row; with `residual` it first forms
`new_residual = x + residual` (rounded to the input dtype, as the decoder's
residual stream is) and normalises that; `x_scale` ([hidden], with a residual)
makes it `x_scale * x + residual`, each op rounded as torch rounds it (InternViT's
layer scale). `weight_offset=1.0` gives Gemma's `(1 + weight)` norm.

The reference follows transformers' rounding: Llama-style norms multiply the
weight after casting the normalised row back to the input dtype; Gemma-style
(offset) norms stay in fp32 until the end. The Triton kernel stays in fp32 until
the final store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.attention.pdl import dependent_launch, launch_next_then_wait, pdl_options
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled

OP = "ops.rms_norm"
MAX_HIDDEN = 65536  # one program holds a whole row


def rms_norm_reference(x, weight, eps, residual=None, weight_offset=0.0, x_scale=None):
    # x, residual: [tokens, hidden]; weight, x_scale: [hidden]
    if x_scale is not None:
        x = x_scale * x
    if residual is not None:
        x = x + residual
        new_residual = x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset == 0.0:
        out = weight * normed.to(x.dtype)
    else:
        out = (normed * (weight.float() + weight_offset)).to(x.dtype)
    return out if residual is None else (out, new_residual)


@triton.jit
def residual_row(x_ptr, res_ptr, xs_ptr, new_res_ptr, row, cols, mask, stride_x, stride_res, stride_new_res,
                 HAS_RESIDUAL: tl.constexpr, X_SCALE: tl.constexpr):  # fmt: skip
    """Row `row` of x, times x_scale (X_SCALE) and plus the residual (HAS_RESIDUAL), each op rounded to the input
    dtype as torch's product and add (and the decoder's residual stream) are; the sum is stored as the new
    residual. The norm kernels' shared prologue."""
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if X_SCALE:
        x = (x.to(tl.float32) * tl.load(xs_ptr + cols, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * stride_new_res + cols, x, mask=mask)
    return x


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, xs_ptr,
    stride_x, stride_res, stride_out, stride_new_res,
    hidden, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, X_SCALE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    launch_next_then_wait(PDL)  # a GEMV after it starts reading its weights; x is the previous kernel's output
    x = residual_row(x_ptr, res_ptr, xs_ptr, new_res_ptr, row, cols, mask, stride_x, stride_res, stride_new_res,
                     HAS_RESIDUAL, X_SCALE)  # fmt: skip
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    tl.store(out_ptr + row * stride_out + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def row_buffers(x, residual):
    """(x, res, out, new_res) of a norm kernel's launch: x and the residual with unit column stride (x stands in for
    a missing residual), the output, and the new residual's buffer (the output's without a residual: unused)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    res = x if residual is None else residual
    if res.stride(-1) != 1:
        res = res.contiguous()
    out = torch.empty_like(x)
    return x, res, out, out if residual is None else torch.empty_like(x)


def num_warps(block: int) -> int:
    """Warps of a one-row-per-program norm kernel over a row of `block` columns."""
    return max(1, min(16, block // 256))


def rms_norm_triton(x, weight, eps, residual=None, weight_offset=0.0, x_scale=None):
    # x, residual: [tokens, hidden]; weight: [hidden]
    tokens, hidden = x.shape
    if hidden > MAX_HIDDEN:
        raise ValueError(f"rms_norm supports hidden sizes up to {MAX_HIDDEN}; got {hidden}")
    x, res, out, new_res = row_buffers(x, residual)
    block = triton.next_power_of_2(hidden)
    pdl = dependent_launch(device_for(x))
    if tokens > 0:
        launch_compiled(_rms_norm_kernel, (tokens,),
            x, res, weight.contiguous(), out, new_res, weight if x_scale is None else x_scale.contiguous(),
            x.stride(0), res.stride(0), out.stride(0), new_res.stride(0),
            hidden, float(eps), float(weight_offset),
            HAS_RESIDUAL=residual is not None, X_SCALE=x_scale is not None, BLOCK=block, PDL=pdl,
            num_warps=num_warps(block), **pdl_options(pdl),
        )  # fmt: skip
    return out if residual is None else (out, new_res)


dispatch.register(OP, rms_norm_reference, rms_norm_triton)


def rms_norm(x, weight, eps, residual=None, weight_offset=0.0, x_scale=None):
    """Normalise each row of x ([tokens, hidden]); with `residual`, return (out, x + residual).

    Args:
        x: [tokens, hidden] activations.
        weight: [hidden] scale.
        eps: added to the mean square.
        residual: optional [tokens, hidden] residual added to x before the norm.
        weight_offset: 1.0 for Gemma's (1 + weight) scale.
        x_scale: optional [hidden] factor of x before the residual add (a residual is required).
    Returns:
        out, or (out, new_residual) when `residual` is given.
    """
    if x.dim() != 2 or weight.shape != (x.shape[-1],):
        raise ValueError(
            f"rms_norm expects x [tokens, hidden] and weight [hidden]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    check_x_scale(x_scale, x, residual)
    impl = dispatch.get_impl(OP, x.dtype, device_for(x))
    return impl(x, weight, eps, residual, weight_offset, x_scale)


def check_x_scale(x_scale, x, residual) -> None:
    if x_scale is not None and (residual is None or x_scale.shape != (x.shape[-1],)):
        raise ValueError(f"x_scale must be [hidden] ({x.shape[-1]}) and come with a residual")
