"""Host lists to device tensors without stalling the host.

A copy from pageable host memory first waits for every kernel already queued on
the stream, so a step that builds its batch while the previous step runs would
serialize host and GPU. Staging through pinned memory makes the copy a real
asynchronous one (torch's caching host allocator keeps the pinned buffer alive
until the copy has run).
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(data, dtype)` on `device` (data: a list or a numpy array), copied asynchronously on CUDA."""
    if isinstance(data, np.ndarray):
        host = torch.from_numpy(data).to(dtype)
    else:
        host = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_rows(rows: list[list[int]], fill: int = 0, multiple: int = 1) -> np.ndarray:
    """[len(rows), longest row rounded up to `multiple`] int32 array of `rows` padded with `fill` (numpy fills
    it ~5x faster than torch.tensor reads nested lists: a 128-sequence batch's block tables are ~10k ints)."""
    width = round_up(max(1, max((len(r) for r in rows), default=1)), multiple)
    out = np.full((len(rows), width), fill, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
