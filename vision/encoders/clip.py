"""CLIP and SigLIP vision transformers (the towers of LLaVA-1.5 and LLaVA-NeXT).

The two differ only in their embeddings: CLIP has a CLS token, a bias-free patch
conv and a LayerNorm before the encoder; SigLIP has none of these. Only the
layers up to the deepest feature layer the VLM reads are built and run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from vlchat.llm.weights import WeightRule, load_tensors
from vlchat.vision.layers import VisionAttention, add_norm, block_output, mlp, uniform_cu_seqlens
from vlchat.vision.weights import FUSED_RULES, drop_layers_rule

_KINDS = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}


@dataclass(slots=True)
class ClipVisionConfig:
    kind: str  # "clip" | "siglip"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    hidden_act: str = "quick_gelu"
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.kind not in ("clip", "siglip"):
            raise ValueError(f"kind must be 'clip' or 'siglip', got {self.kind!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    @classmethod
    def from_hf(cls, cfg) -> ClipVisionConfig:
        kind = _KINDS.get(getattr(cfg, "model_type", ""))
        if kind is None:
            raise ValueError(f"vision tower type {cfg.model_type!r} is not supported; supported: {', '.join(_KINDS)}")
        return cls(
            kind, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.image_size, cfg.patch_size, getattr(cfg, "num_channels", 3), cfg.hidden_act, cfg.layer_norm_eps,
        )  # fmt: skip

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def seq_len(self) -> int:
        return self.num_patches + (1 if self.kind == "clip" else 0)


class ClipEncoderLayer(nn.Module):
    def __init__(self, cfg: ClipVisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.self_attn = VisionAttention(cfg.hidden_size, cfg.num_heads)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.mlp = mlp(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(
        self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, pending: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block on the residual stream x + pending (pending: the previous block's MLP output, not yet added, or
        None); returns (stream, mlp_out), the block's output being their sum, which the next block's first norm
        adds as it normalizes (`add_norm`)."""
        h, x = add_norm(self.layer_norm1, x, pending)
        h, x = add_norm(self.layer_norm2, self.self_attn(h, cu_seqlens, max_seqlen), x)
        return x, self.mlp(h)


class ClipEmbeddings(nn.Module):
    def __init__(self, cfg: ClipVisionConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.patch_embedding = nn.Conv2d(cfg.num_channels, d, cfg.patch_size, cfg.patch_size, bias=cfg.kind == "siglip")
        self.class_embedding = nn.Parameter(torch.zeros(d)) if cfg.kind == "clip" else None
        self.position_embedding = nn.Embedding(cfg.seq_len, d)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # pixel_values: [images, C, H, W] -> [images, seq, d]
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)  # [n, patches, d]
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        return x + self.position_embedding.weight


class ClipEncoder(nn.Module):
    def __init__(self, cfg: ClipVisionConfig, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ClipEncoderLayer(cfg) for _ in range(depth))


class ClipVisionTower(nn.Module):
    """Returns the hidden states the VLM asks for, in HF's `hidden_states` numbering.

    Args:
        cfg: the tower's shape.
        feature_layers: HF `hidden_states` indices (0 = embeddings, -1 = last layer; before any post norm).
    """

    def __init__(self, cfg: ClipVisionConfig, feature_layers: list[int]) -> None:
        super().__init__()
        self.cfg = cfg
        self.feature_layers = [f if f >= 0 else cfg.num_layers + 1 + f for f in feature_layers]
        if not all(0 <= f <= cfg.num_layers for f in self.feature_layers):
            raise ValueError(f"vision_feature_layer {feature_layers} out of range for {cfg.num_layers} layers")
        self.embeddings = ClipEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps) if cfg.kind == "clip" else None
        self.encoder = ClipEncoder(cfg, max(self.feature_layers))

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """pixel_values: [images, channels, H, W] -> one [images, seq, hidden] per feature layer."""
        x = self.embeddings(pixel_values)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        n, seq, d = x.shape
        cu_seqlens = uniform_cu_seqlens(n, seq, x.device)
        x = x.reshape(n * seq, d)  # [tokens, d]
        hidden = {0: x}
        pending = None
        for i, layer in enumerate(self.encoder.layers):
            x, pending = layer(x, cu_seqlens, seq, pending)
            if i + 1 in self.feature_layers:  # (the last layer is one)
                x, pending = block_output(x, pending), None
                hidden[i + 1] = x
        return [hidden[f].view(n, seq, d) for f in self.feature_layers]

    def weight_rules(self) -> list[WeightRule]:
        """Rules for HF tower names (with or without `vision_model.`), also under a VLM's prefix."""
        return [
            WeightRule(r"vision_model\.", ""),
            WeightRule(r"(^|\.)(post_layernorm|head)\.", None),  # pooling parts the VLMs never read
            WeightRule(r"embeddings\.position_ids$", None),
            *drop_layers_rule(r"encoder\.layers", len(self.encoder.layers), self.cfg.num_layers),
            WeightRule(r"\.self_attn\.out_proj\.", ".self_attn.proj."),
            *FUSED_RULES,
        ]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_tensors(self, weights, self.weight_rules(), "the vision tower")
