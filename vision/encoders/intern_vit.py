"""InternViT (the tower of HF-native InternVL): pre-norm blocks with layer scale, optional q/k RMSNorm.

Followed in the VLM by `pixel_shuffle`, which folds each 2x2 block of patch features into
one token four times as wide before the projector.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from vlchat.llm.weights import WeightRule, load_tensors
from vlchat.vision.layers import RMSNorm, VisionAttention, add_norm, block_output, mlp, uniform_cu_seqlens
from vlchat.vision.weights import FUSED_RULES, drop_layers_rule


def _pair(v) -> int:
    if isinstance(v, (list, tuple)):
        if v[0] != v[1]:
            raise ValueError(f"non-square InternViT sizes are not supported: {v}")
        return int(v[0])
    return int(v)


@dataclass(slots=True)
class InternViTConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    hidden_act: str = "gelu"
    eps: float = 1e-6
    norm_type: str = "layer_norm"
    qkv_bias: bool = False
    qk_norm: bool = False
    final_norm: bool = False  # a LayerNorm after the last layer (use_mean_pooling=False)

    def __post_init__(self) -> None:
        if self.norm_type not in ("layer_norm", "rms_norm"):
            raise ValueError(f"norm_type must be layer_norm or rms_norm, got {self.norm_type!r}")

    @classmethod
    def from_hf(cls, cfg) -> InternViTConfig:
        if not getattr(cfg, "use_absolute_position_embeddings", True):
            raise ValueError("InternViT without absolute position embeddings is not supported")
        return cls(
            cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            _pair(cfg.image_size), _pair(cfg.patch_size), cfg.num_channels, cfg.hidden_act, cfg.layer_norm_eps,
            cfg.norm_type, cfg.attention_bias, cfg.use_qk_norm, not cfg.use_mean_pooling,
        )  # fmt: skip

    @property
    def seq_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1


class InternViTLayer(nn.Module):
    def __init__(self, cfg: InternViTConfig) -> None:
        super().__init__()
        norm = nn.LayerNorm if cfg.norm_type == "layer_norm" else RMSNorm
        self.layernorm_before = norm(cfg.hidden_size, eps=cfg.eps)
        self.attention = VisionAttention(cfg.hidden_size, cfg.num_heads, cfg.qkv_bias, cfg.qk_norm)
        self.layernorm_after = norm(cfg.hidden_size, eps=cfg.eps)
        self.mlp = mlp(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.lambda_1 = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lambda_2 = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward(self, x, cu_seqlens, max_seqlen, pending=None):
        """As ClipEncoderLayer.forward, with layer scales: the stream x + lambda * out for pending = (out, lambda) of
        the previous layer (or None) in; (stream, (mlp_out, lambda_2)) out."""
        if pending is None:
            h, x = add_norm(self.layernorm_before, x)
        else:
            out, scale = pending
            h, x = add_norm(self.layernorm_before, out, x, scale)
        h, x = add_norm(self.layernorm_after, self.attention(h, cu_seqlens, max_seqlen), x, self.lambda_1)
        return x, (self.mlp(h), self.lambda_2)


class InternViT(nn.Module):
    """pixel_values [tiles, C, H, W] -> [tiles, 1 + patches, hidden] at HF `vision_feature_layer`."""

    def __init__(self, cfg: InternViTConfig, feature_layer: int = -1) -> None:
        super().__init__()
        self.cfg = cfg
        self.use_final_norm = feature_layer == -1 and cfg.final_norm
        depth = feature_layer if feature_layer >= 0 else cfg.num_layers + 1 + feature_layer
        if not 0 <= depth <= cfg.num_layers:
            raise ValueError(f"vision_feature_layer {feature_layer} out of range for {cfg.num_layers} layers")
        d = cfg.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.projection = nn.Conv2d(cfg.num_channels, d, cfg.patch_size, cfg.patch_size)
        self.position_embeddings = nn.Parameter(torch.zeros(1, cfg.seq_len, d))
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(InternViTLayer(cfg) for _ in range(depth))
        self.layernorm = nn.LayerNorm(d, eps=cfg.eps) if self.use_final_norm else None

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n = pixel_values.shape[0]
        if pixel_values.shape[-1] != self.cfg.image_size or pixel_values.shape[-2] != self.cfg.image_size:
            raise ValueError(f"InternViT takes {self.cfg.image_size}px tiles, got {tuple(pixel_values.shape[-2:])}")
        x = self.projection(pixel_values.to(self.projection.weight.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(n, -1, -1), x], dim=1) + self.position_embeddings
        seq, d = x.shape[1], x.shape[2]
        cu_seqlens = uniform_cu_seqlens(n, seq, x.device)
        x = x.reshape(n * seq, d)
        pending = None
        for layer in self.encoder.layer:
            x, pending = layer(x, cu_seqlens, seq, pending)
        if pending is not None:
            x = block_output(x, *pending)
        if self.layernorm is not None:
            x = self.layernorm(x)
        return x.view(n, seq, d)

    def weight_rules(self) -> list[WeightRule]:
        """Rules for the HF `vision_tower.*` names, also under a VLM's prefix."""
        rules = [
            WeightRule(r"embeddings\.patch_embeddings\.projection\.", "projection."),
            WeightRule(r"embeddings\.(cls_token|position_embeddings)$", r"\1"),
            *drop_layers_rule(r"encoder\.layer", len(self.encoder.layer), self.cfg.num_layers),
            WeightRule(r"\.attention\.projection_layer\.", ".attention.proj."),
            *FUSED_RULES,
        ]
        if self.layernorm is None:
            rules.insert(0, WeightRule(r"(^|\.)layernorm\.(weight|bias)$", None))
        return rules

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_tensors(self, weights, self.weight_rules(), "the InternViT tower")


def pixel_shuffle(features: torch.Tensor, scale: float) -> torch.Tensor:
    """[tiles, side, side, C] -> [tiles, side*scale, side*scale, C/scale**2], exactly as HF InternVL folds it."""
    n, w, h, c = features.shape
    x = features.view(n, w, int(h * scale), int(c / scale)).permute(0, 2, 1, 3).contiguous()
    x = x.view(n, int(h * scale), int(w * scale), int(c / scale**2))
    return x.permute(0, 2, 1, 3).contiguous()
