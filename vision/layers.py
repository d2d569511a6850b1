"""Building blocks shared by the vision towers: packed-QKV attention on the varlen kernel, norms, MLPs.

Every tower runs on packed tokens `[tokens, dim]` with `cu_seqlens` marking where each
image (or window) starts, so a batch of images of different sizes is one kernel call.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from vlchat.kernels.attention import varlen_attention
from vlchat.kernels.ops import apply_rotary, layer_norm, quick_gelu, rms_norm
from vlchat.kernels.ops.linear_act import linear_act
from vlchat.llm.layers.activation import get_act_and_mul
from vlchat.llm.layers.linear import MergedLinear, QKVLinear


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), CLIP's activation (one kernel on a GPU: kernels.ops.quick_gelu)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quick_gelu(x)


ACTIVATIONS = {
    "quick_gelu": QuickGELU,
    "gelu": nn.GELU,
    "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh"),
    "gelu_new": partial(nn.GELU, approximate="tanh"),
    "silu": nn.SiLU,
    "relu": nn.ReLU,
}


# each of ACTIVATIONS as the epilogue of kernels.ops.linear_act
FUSED_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
              "silu": "silu", "relu": "relu"}  # fmt: skip


def activation(name: str) -> type[nn.Module]:
    if name not in ACTIVATIONS:
        raise ValueError(f"vision activation {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class Mlp(nn.Module):
    """fc1 -> act -> fc2 (the parameter names match the HF towers'); fc1 and its activation are one GEMM where
    the arch has a measured config (kernels.ops.linear_act)."""

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        activation(act)  # refuses an unsupported name
        self.fc1 = nn.Linear(dim, hidden)
        self.act = FUSED_ACTS[act]
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(linear_act(x, self.fc1.weight, self.fc1.bias, self.act))


def mlp(dim: int, hidden: int, act: str) -> Mlp:
    return Mlp(dim, hidden, act)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and scaled in the input dtype, as the HF vision towers do."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def add_norm(
    norm: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None, x_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), or (norm(x), x) without a residual; with `x_scale` ([hidden], a layer
    scale) x_scale * x in place of x. A block's residual add and the norm after it in one kernel on a GPU for
    LayerNorm and RMSNorm (kernels.ops), so the residual stream is read and written once."""
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None and norm.bias is not None:
        out = layer_norm(x, norm.weight, norm.bias, norm.eps, residual, x_scale)
    elif isinstance(norm, RMSNorm):
        out = rms_norm(x, norm.weight, norm.eps, residual, x_scale=x_scale)
    else:
        stream = x if x_scale is None else x_scale * x
        stream = stream if residual is None else stream + residual
        return norm(stream), stream
    return (out, x) if residual is None else out


def block_output(x: torch.Tensor, pending: torch.Tensor | None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """A block's output from the residual stream x and its MLP's output `pending` (None: already added), times
    `scale` where the block has a layer scale."""
    if pending is None:
        return x
    return x + (pending if scale is None else scale * pending)


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one `gate_up_proj` GEMM."""

    def __init__(self, dim: int, hidden: int, act: str = "silu", bias: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(dim, [hidden, hidden], bias=bias)
        self.act = get_act_and_mul(act)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention within each segment of cu_seqlens (one image or window).

    q, k and v come from one fused `qkv_proj` linear (pieces "q", "k", "v"), the output
    projection is `proj`; `rotary` = (rows [tokens] int64, table [rows, head_dim] fp32: cos half
    then sin half) rotates q and k neox-style (kernels.ops.apply_rotary, fp32 math like the
    HF Qwen towers); `qk_norm` is InternViT-6B's RMSNorm over
    the whole q and k vectors.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"vision hidden size {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv_proj = QKVLinear(dim, self.head_dim, num_heads, num_heads, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.q_norm = RMSNorm(dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(dim, eps) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [tokens, dim]
        cu_seqlens: torch.Tensor,  # [segments + 1] int32
        max_seqlen: int,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # each [tokens, dim]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_heads, self.head_dim)
        v = v.reshape(tokens, self.num_heads, self.head_dim)
        if rotary is not None:
            q, k = apply_rotary(q, k, rotary[0], rotary[1])
        out = varlen_attention(q, k, v, cu_seqlens, max_seqlen, self.scale)  # head_dim-contiguous views suffice
        return self.proj(out.reshape(tokens, -1))


def uniform_cu_seqlens(num_segments: int, length: int, device: torch.device) -> torch.Tensor:
    return torch.arange(num_segments + 1, device=device, dtype=torch.int32) * length
