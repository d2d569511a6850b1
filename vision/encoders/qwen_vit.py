"""The Qwen2-VL and Qwen2.5-VL vision transformers: native-resolution patches, 2D rotary, patch merger.

Qwen2-VL: LayerNorm blocks with a GELU MLP, every block attends over the whole image.
Qwen2.5-VL: RMSNorm blocks with a SwiGLU MLP; blocks attend within windows of
`window_size` pixels except those at `fullatt_block_indexes`, which see the whole image.
Both take the processor's flattened patches `[patches, C*T*P*P]` and `grid_thw`
`[images, 3]`, and return `[patches / merge**2, out_hidden]` merged tokens in the
processor's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.llm.engine.transfer import tensor_to_device
from vlchat.llm.weights import WeightRule, load_tensors
from vlchat.vision.layers import RMSNorm, SwiGLU, VisionAttention, add_norm, block_output, mlp
from vlchat.vision.weights import FUSED_RULES, packed_rule

from .qwen_windows import full_cu_seqlens, rotary_positions, window_index


@dataclass(slots=True)
class QwenViTConfig:
    version: str  # "2" | "2.5"
    dim: int
    depth: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    hidden_act: str
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    rope_theta: float = 10000.0
    window_size: int = 0  # pixels; 0 = no windows (Qwen2-VL)
    fullatt_block_indexes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.version not in ("2", "2.5"):
            raise ValueError(f"version must be '2' or '2.5', got {self.version!r}")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 4:
            raise ValueError(f"vision dim {self.dim} / {self.num_heads} heads must give a head_dim divisible by 4")

    @classmethod
    def from_hf(cls, cfg) -> QwenViTConfig:
        rope = getattr(cfg, "rope_parameters", None) or {}
        common = dict(
            num_heads=cfg.num_heads,
            hidden_act=cfg.hidden_act,
            patch_size=cfg.patch_size,
            temporal_patch_size=cfg.temporal_patch_size,
            spatial_merge_size=cfg.spatial_merge_size,
            in_channels=getattr(cfg, "in_channels", getattr(cfg, "in_chans", 3)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )
        if hasattr(cfg, "out_hidden_size"):  # Qwen2.5-VL
            return cls(
                "2.5", cfg.hidden_size, cfg.depth, intermediate_size=cfg.intermediate_size,
                out_hidden_size=cfg.out_hidden_size, window_size=cfg.window_size,
                fullatt_block_indexes=list(cfg.fullatt_block_indexes), **common,
            )  # fmt: skip
        return cls(
            "2", cfg.embed_dim, cfg.depth, intermediate_size=int(cfg.embed_dim * cfg.mlp_ratio),
            out_hidden_size=cfg.hidden_size, **common,
        )  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(slots=True)
class VisionPlan:
    """Per-grid inputs of `encode`: the rotary table (row i for patch i, cos half then sin half, fp32),
    full-image and window segments."""

    rows: torch.Tensor
    table: torch.Tensor
    cu_full: torch.Tensor
    max_full: int
    order: torch.Tensor | None  # merged-token permutation into windows (Qwen2.5-VL)
    reverse: torch.Tensor | None
    cu_win: torch.Tensor | None
    max_win: int

    def tensors(self) -> list[torch.Tensor]:
        extra = [] if self.order is None else [self.order, self.reverse, self.cu_win]
        return [self.rows, self.table, self.cu_full, *extra]


class QwenViTBlock(nn.Module):
    def __init__(self, cfg: QwenViTConfig) -> None:
        super().__init__()
        if cfg.version == "2":
            self.norm1, self.norm2 = nn.LayerNorm(cfg.dim, eps=1e-6), nn.LayerNorm(cfg.dim, eps=1e-6)
            self.mlp = mlp(cfg.dim, cfg.intermediate_size, cfg.hidden_act)
        else:
            self.norm1, self.norm2 = RMSNorm(cfg.dim), RMSNorm(cfg.dim)
            self.mlp = SwiGLU(cfg.dim, cfg.intermediate_size, cfg.hidden_act, bias=True)
        self.attn = VisionAttention(cfg.dim, cfg.num_heads)

    def forward(self, x, cu_seqlens, max_seqlen, rotary, pending=None):
        """As ClipEncoderLayer.forward: the stream x + pending in, (stream, mlp_out) out."""
        h, x = add_norm(self.norm1, x, pending)
        h, x = add_norm(self.norm2, self.attn(h, cu_seqlens, max_seqlen, rotary), x)
        return x, self.mlp(h)


class PatchMerger(nn.Module):
    """Norm, then each merge x merge block of neighbouring patches -> one LLM token through an MLP."""

    def __init__(self, cfg: QwenViTConfig) -> None:
        super().__init__()
        self.merged_dim = cfg.dim * cfg.spatial_merge_size**2
        self.ln_q = nn.LayerNorm(cfg.dim, eps=1e-6) if cfg.version == "2" else RMSNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged_dim, self.merged_dim), nn.GELU(), nn.Linear(self.merged_dim, cfg.out_hidden_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged_dim))


class QwenVisionTransformer(nn.Module):
    def __init__(self, cfg: QwenViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.dim, kernel, kernel, bias=False)
        half = cfg.head_dim // 2
        # a host tensor, not a buffer: `plan` builds the rotary table on the host, and reading a device copy back
        # would wait for the step running on the device
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float, device="cpu") / half))
        self.blocks = nn.ModuleList(QwenViTBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixel_values: [patches, C*T*P*P]; grid_thw: [images, 3] -> [patches / merge**2, out_hidden]."""
        plan = self.plan(grid_thw, pixel_values.device)
        return self.encode(pixel_values, *plan.tensors(), max_full=plan.max_full, max_win=plan.max_win)

    def plan(self, grid_thw: torch.Tensor, device: torch.device) -> VisionPlan:
        """Everything that depends only on the grids, computed on the host and moved once."""
        cfg = self.cfg
        grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
        pos = rotary_positions(grids, cfg.spatial_merge_size)  # [N, 2]
        freqs = (pos[..., None].float() * self.inv_freq).flatten(1)  # [N, head_dim / 2]: h then w
        table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [N, head_dim]
        cu_full, max_full = full_cu_seqlens(grids, device)
        if not cfg.window_size:
            order = reverse = cu_win = None
            max_win = 0
        else:
            unit = cfg.spatial_merge_size**2
            order, cu_win, max_win = window_index(grids, cfg.spatial_merge_size, cfg.window_size, cfg.patch_size)
            table = table.view(-1, unit, table.shape[-1])[order].view(-1, table.shape[-1])
            order, reverse, cu_win = (tensor_to_device(t, device) for t in (order, torch.argsort(order), cu_win))
        rows = torch.arange(table.shape[0], device=device)
        return VisionPlan(rows, tensor_to_device(table, device), cu_full, max_full, order, reverse, cu_win, max_win)

    def encode(self, pixel_values, rows, table, cu_full, order=None, reverse=None, cu_win=None, *, max_full, max_win):
        """The device part of the forward (capturable in a CUDA graph for one set of grids)."""
        cfg = self.cfg
        weight = self.patch_embed.proj.weight
        # The conv's kernel equals its stride over the whole patch: it is one matmul.
        x = F.linear(pixel_values.to(weight.dtype).view(-1, cfg.patch_dim), weight.view(cfg.dim, -1))  # [N, dim]
        if order is not None:
            unit = cfg.spatial_merge_size**2
            x = x.view(-1, unit, cfg.dim)[order].view(-1, cfg.dim)
        pending = None
        for i, block in enumerate(self.blocks):
            if order is None or i in cfg.fullatt_block_indexes:
                x, pending = block(x, cu_full, max_full, (rows, table), pending)
            else:
                x, pending = block(x, cu_win, max_win, (rows, table), pending)
        merged = self.merger(block_output(x, pending))
        return merged if reverse is None else merged[reverse]

    def weight_rules(self) -> list[WeightRule]:
        """Rules for the HF `visual.*` names (the checkpoint packs q/k/v already)."""
        return [packed_rule(r"\.attn\.qkv\.", ".attn.qkv_proj."), *FUSED_RULES]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_tensors(self, weights, self.weight_rules(), "the Qwen vision tower")
