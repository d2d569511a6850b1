"""One registry that picks an implementation per op for (device, dtype).

Each op registers a torch reference (runs anywhere) and, where it has one, a
Triton implementation with a predicate saying whether it can run for a given
device and dtype. `auto` takes Triton where it can run and falls back to the
reference; a forced backend that cannot run raises `KernelUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlchat.kernels import settings
from vlchat.kernels.device import DeviceInfo, TritonMode, get_device_info


class KernelUnavailableError(RuntimeError):
    """A forced kernel backend cannot run on this device/dtype."""


# can_run(device, dtype) -> None if it can run, else the reason it cannot
CanRun = Callable[[DeviceInfo, torch.dtype], "str | None"]


def triton_can_run(device: DeviceInfo, dtype: torch.dtype) -> str | None:
    """Default predicate for Triton kernels: triton present, compiled or interpreted, dtype supported."""
    if device.triton == TritonMode.UNAVAILABLE:
        return "Triton cannot run here (no triton package, or a CPU without TRITON_INTERPRET=1)"
    if dtype == torch.bfloat16 and not device.supports_bf16:
        return f"bf16 needs compute capability >= 8.0; {device.arch} has none (use float16)"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {dtype} is not supported by the Triton kernels"
    return None


@dataclass(slots=True)
class _Op:
    reference: Callable
    triton: Callable | None = None
    triton_can_run: CanRun = triton_can_run


_OPS: dict[str, _Op] = {}


def register(name: str, reference: Callable, triton: Callable | None = None, can_run: CanRun | None = None) -> None:
    _OPS[name] = _Op(reference, triton, can_run or triton_can_run)


def registered_ops() -> list[str]:
    return sorted(_OPS)


def choose(name: str, dtype: torch.dtype, device: DeviceInfo | None = None, backend: str | None = None) -> str:
    """Return "triton" or "torch": the implementation `name` runs with for this device and dtype."""
    op = _OPS[name]
    device = device or get_device_info()
    backend = backend or settings.get_backend()
    reason = "no Triton implementation" if op.triton is None else op.triton_can_run(device, dtype)
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if reason is not None:
            raise KernelUnavailableError(f"kernel backend 'triton' was forced for {name}, but {reason}")
        return "triton"
    if reason is not None:
        return "torch"
    # The interpreter is for tests; auto mode on a CPU runs the reference.
    return "triton" if device.triton == TritonMode.COMPILED else "torch"


def get_impl(name: str, dtype: torch.dtype, device: DeviceInfo | None = None, backend: str | None = None) -> Callable:
    op = _OPS[name]
    return op.triton if choose(name, dtype, device, backend) == "triton" else op.reference
