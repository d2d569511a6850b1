"""Host lists to device tensors without stalling the host.

A copy from pageable host memory first waits for every kernel already queued on
the stream, so a step that builds its batch while the previous step runs would
serialize host and GPU. Staging through pinned memory makes the copy a real
asynchronous one (torch's caching host allocator keeps the pinned buffer alive
until the copy has run).
"""

from __future__ import annotations

import torch


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(data, dtype)` on `device`, copied asynchronously on CUDA."""
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
