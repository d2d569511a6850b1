"""Index bookkeeping of the Qwen vision towers, computed on the host from the images' grids.

Patches arrive block-major: each spatial_merge x spatial_merge block of neighbouring
patches is consecutive (the processor lays them out so), which the positions, the
windows and the merger all rely on.
"""

from __future__ import annotations

import torch

from vlchat.llm.engine.transfer import tensor_to_device

Grid = tuple[int, int, int]  # (t, h, w) in patches


def rotary_positions(grids: list[Grid], merge: int) -> torch.Tensor:
    """[patches, 2] (row, column) of every patch, in the block-major order of the processor."""
    out = []
    for t, h, w in grids:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows = rows.permute(0, 2, 1, 3).flatten()
        cols = cols.permute(0, 2, 1, 3).flatten()
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    return torch.cat(out)


def full_cu_seqlens(grids: list[Grid], device: torch.device) -> tuple[torch.Tensor, int]:
    """One attention segment per frame: ([segments + 1] int32, longest segment)."""
    lengths = [h * w for t, h, w in grids for _ in range(t)]
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return tensor_to_device(cu, device), max(lengths)


def window_index(grids: list[Grid], merge: int, window_size: int, patch_size: int) -> tuple[torch.Tensor, ...]:
    """Qwen2.5-VL windows over merged tokens.

    Returns (order, cu_seqlens, max_seqlen): `order` [merged tokens] permutes merged tokens so that
    each window is consecutive; cu_seqlens [windows + 1] int32 counts patches (merge**2 per token).
    """
    win = window_size // merge // patch_size  # window side in merged tokens
    unit = merge * merge
    order, lengths, base = [], [], 0
    for t, h, w in grids:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).view(t, gh, gw)
        pad_h, pad_w = (-gh) % win, (-gw) % win
        padded = torch.nn.functional.pad(index, (0, pad_w, 0, pad_h), value=-1)
        nh, nw = (gh + pad_h) // win, (gw + pad_w) // win
        padded = padded.view(t, nh, win, nw, win).permute(0, 1, 3, 2, 4).reshape(t, nh * nw, win * win)
        counts = (padded >= 0).sum(-1).flatten()
        flat = padded.flatten()
        order.append(flat[flat >= 0] + base)
        lengths.extend(c * unit for c in counts.tolist() if c > 0)
        base += t * gh * gw
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return torch.cat(order), cu, max(lengths)
