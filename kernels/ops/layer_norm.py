"""LayerNorm (with bias), optionally fused with the residual add before it: the vision towers' norm.

`layer_norm(x, weight, bias, eps)` normalises each row; with `residual` it first forms
`new_residual = x + residual` (rounded to the input dtype, as torch's add is) and
normalises that, so a block's `x = x + attn(...); h = norm2(x)` reads and writes the
residual stream once instead of twice; `x_scale` ([hidden]) makes the sum
`x_scale * x + residual` (InternViT's layer scale), the product rounded as torch's is. Both the reference (torch's layer_norm) and the
kernel compute the statistics in fp32 and round once at the end.
"""

from __future__ import annotations

import torch.nn.functional as F
import triton
import triton.language as tl

from vlchat.kernels import dispatch
from vlchat.kernels.device import device_for
from vlchat.kernels.launch import launch_compiled
from vlchat.kernels.ops.rms_norm import MAX_HIDDEN, check_x_scale, num_warps, residual_row, row_buffers

OP = "ops.layer_norm"


def layer_norm_reference(x, weight, bias, eps, residual=None, x_scale=None):
    # x, residual: [tokens, hidden]; weight, bias, x_scale: [hidden]
    if x_scale is not None:
        x = x_scale * x
    if residual is not None:
        x = x + residual
    out = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return out if residual is None else (out, x)


@triton.jit
def _layer_norm_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, new_res_ptr, xs_ptr,
    stride_x, stride_res, stride_out, stride_new_res, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, X_SCALE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = residual_row(x_ptr, res_ptr, xs_ptr, new_res_ptr, row, cols, mask, stride_x, stride_res, stride_new_res,
                     HAS_RESIDUAL, X_SCALE)  # fmt: skip
    xf = x.to(tl.float32)
    mean = tl.sum(xf, axis=0) / hidden
    diff = tl.where(mask, xf - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (diff * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm_triton(x, weight, bias, eps, residual=None, x_scale=None):
    tokens, hidden = x.shape
    x, res, out, new_res = row_buffers(x, residual)
    block = triton.next_power_of_2(hidden)
    if tokens > 0:
        launch_compiled(_layer_norm_kernel, (tokens,),
            x, res, weight.contiguous(), bias.contiguous(), out, new_res,
            weight if x_scale is None else x_scale.contiguous(),
            x.stride(0), res.stride(0), out.stride(0), new_res.stride(0), hidden, float(eps),
            HAS_RESIDUAL=residual is not None, X_SCALE=x_scale is not None, BLOCK=block, num_warps=num_warps(block),
        )  # fmt: skip
    return out if residual is None else (out, new_res)


dispatch.register(OP, layer_norm_reference, layer_norm_triton)


def layer_norm(x, weight, bias, eps, residual=None, x_scale=None):
    """LayerNorm of each row of x ([tokens, hidden]) with weight and bias ([hidden]); with `residual`
    ([tokens, hidden]), return (norm(x + residual), x + residual); with `x_scale` ([hidden], a residual given)
    x_scale * x in place of x."""
    hidden = x.shape[-1]
    if x.dim() != 2 or weight.shape != (hidden,) or bias.shape != (hidden,):
        raise ValueError(
            f"layer_norm expects x [tokens, hidden], weight and bias [hidden]; got {tuple(x.shape)}, "
            f"{tuple(weight.shape)}, {tuple(bias.shape)}"
        )
    if hidden > MAX_HIDDEN:
        raise ValueError(f"layer_norm supports hidden sizes up to {MAX_HIDDEN}; got {hidden}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    check_x_scale(x_scale, x, residual)
    return dispatch.get_impl(OP, x.dtype, device_for(x))(x, weight, bias, eps, residual, x_scale)
