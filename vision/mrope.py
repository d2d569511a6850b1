"""M-RoPE (Qwen2-VL, Qwen2.5-VL): three position streams (time, row, column) share the rotary frequencies.

Text tokens have equal positions on all three streams; an image's tokens count
time, row and column from where the text stopped, and the text after it resumes
at that start + max(rows, columns). Frequency j rotates by the stream of its
`mrope_section` (sections over head_dim / 2, in order t, h, w).
"""

from __future__ import annotations

import torch

from vlchat.kernels.ops import apply_rotary
from vlchat.llm.inputs import ImageItem
from vlchat.llm.rope import RotaryEmbedding


class MRotaryEmbedding(RotaryEmbedding):
    """A RotaryEmbedding whose forward takes positions [3, tokens] (or [tokens] for text-only rows)."""

    def __init__(self, head_dim: int, max_position: int, params: dict, mrope_section: list[int], dtype) -> None:
        super().__init__(head_dim, head_dim, max_position, params, dtype, is_neox=True)
        if sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {mrope_section} must sum to head_dim / 2 = {head_dim // 2}")
        stream = torch.repeat_interleave(torch.arange(3), torch.tensor(mrope_section[:3]))  # [head_dim / 2]
        self.register_buffer("stream", stream, persistent=False)
        self.register_buffer("columns", torch.arange(head_dim // 2), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [3, tokens] or [tokens]; q: [tokens, heads, head_dim] (or flat); k likewise
        if self.cos_sin_cache.device != q.device:
            self.cos_sin_cache = self.cos_sin_cache.to(q.device)
        if positions.dim() == 1:
            positions = positions.expand(3, -1)
        half = self.rotary_dim // 2
        rows = positions[self.stream.to(positions.device)].t()  # [tokens, half]: the stream each frequency reads
        cols = self.columns.to(positions.device)
        cos = self.cos_sin_cache[:, :half][rows, cols]  # [tokens, half]
        sin = self.cos_sin_cache[:, half:][rows, cols]
        table = torch.cat([cos, sin], dim=-1)  # [tokens, rotary_dim]: one row per token
        tokens = torch.arange(q.shape[0], device=q.device)
        q3 = q.view(q.shape[0], -1, self.head_dim)
        k3 = k.view(k.shape[0], -1, self.head_dim)
        q3, k3 = apply_rotary(q3, k3, tokens, table, self.rotary_dim, True)
        return q3.view(q.shape), k3.view(k.shape)


def mrope_positions(num_tokens: int, images: list[ImageItem], merge: int) -> tuple[torch.Tensor, int]:
    """([3, num_tokens] int64 positions, delta) as transformers' get_rope_index computes them for images.

    `delta` = max position + 1 - num_tokens: generated token n (0-based, after the prompt) sits at
    num_tokens + n + delta on all three streams.
    """
    chunks, cursor, start = [], 0, 0
    for item in sorted(images, key=lambda i: i.offset):
        text = item.offset - cursor
        chunks.append(torch.arange(text).expand(3, -1) + start)
        start += text
        t, h, w = (int(v) for v in item.data["image_grid_thw"].view(-1).tolist())
        gh, gw = h // merge, w // merge
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")).reshape(
            3, -1
        )
        chunks.append(grid + start)
        start += max(gh, gw)
        cursor = item.end
    chunks.append(torch.arange(num_tokens - cursor).expand(3, -1) + start)
    positions = torch.cat(chunks, dim=1).long()
    return positions, int(positions.max()) + 1 - num_tokens
