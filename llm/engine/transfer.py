"""Host lists to device tensors without stalling the host.

A copy from pageable host memory first waits for every kernel already queued on
the stream, so a step that builds its batch while the previous step runs would
serialize host and GPU. Staging through pinned memory makes the copy a real
asynchronous one (torch's caching host allocator keeps the pinned buffer alive
until the copy has run).

A step's integer inputs travel packed (`Packed`): one pinned buffer per dtype and one
copy each, instead of a tensor, a pinned buffer and a copy per input. On a slow host
each of those costs tens of microseconds, which at a few milliseconds per step of a
small model is what bounds its decode rate.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(data, dtype)` on `device` (data: a list or a numpy array), copied asynchronously on CUDA."""
    if isinstance(data, np.ndarray):
        host = torch.from_numpy(data).to(dtype)
    else:
        host = torch.tensor(data, dtype=dtype)
    return tensor_to_device(host, device)


def tensor_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t.to(device)`; a host tensor bound for a GPU is staged through pinned memory, so the copy queues behind the
    stream's work instead of waiting for it (image pixels copied while the previous step runs)."""
    if device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_rows(rows: list[list[int]] | list[np.ndarray], fill: int = 0, multiple: int = 1) -> np.ndarray:
    """[len(rows), longest row rounded up to `multiple`] int32 array of `rows` padded with `fill` (numpy fills
    it several times faster than torch.tensor reads nested lists: a 128-sequence batch's block tables are ~10k
    ints)."""
    width = round_up(max(1, max((len(r) for r in rows), default=1)), multiple)
    out = np.full((len(rows), width), fill, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


ALIGN = 16  # elements from one packed part to the next: each starts 64-byte aligned, as a fresh tensor would


class Packed:
    """Integer arrays (lists or numpy arrays) back to back in one host buffer, each at a multiple of ALIGN elements,
    pinned on CUDA so that one asynchronous copy moves them all; `to` returns the device views of the parts.

    The offsets depend only on the parts' sizes, so a buffer captured by a CUDA graph reads a later step's parts
    where they land when that step's packing starts with parts of the same sizes."""

    def __init__(self, parts: list, dtype: torch.dtype, device: torch.device) -> None:
        shapes = [np.shape(p) for p in parts]
        sizes = [math.prod(shape) for shape in shapes]
        offsets = self.layout(sizes)
        self.parts = list(zip(offsets[:-1], sizes, shapes, strict=True))  # (offset, size, shape) of each part
        self.device = device
        self.host = torch.empty(offsets[-1], dtype=dtype, pin_memory=device.type == "cuda")
        flat = self.host.numpy()
        for part, (lo, size, shape) in zip(parts, self.parts, strict=True):
            flat[lo : lo + size] = np.ravel(part) if len(shape) > 1 else part

    @staticmethod
    def layout(sizes: list[int]) -> list[int]:
        """The parts' offsets, then the buffer's length."""
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + round_up(size, ALIGN))
        return offsets

    def to(self, out: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Copy the buffer to the device (into the front of `out` when given) and return the parts' views there."""
        if out is not None:
            dev = out[: self.host.shape[0]]
            dev.copy_(self.host, non_blocking=True)
        elif self.device.type == "cuda":
            dev = self.host.to(self.device, non_blocking=True)
        else:
            dev = self.host
        return [dev[lo : lo + size].view(shape) for lo, size, shape in self.parts]
