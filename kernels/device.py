"""One cached description of the device the kernels run on.

Everything that dispatch and the per-arch config tables need to know about the
hardware is read here once: the kind of device, its compute capability, SM
count, shared memory per block, bf16 support and how Triton can run on it.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import os
from dataclasses import dataclass

import torch


class TritonMode(str, enum.Enum):
    COMPILED = "compiled"  # real GPU kernels
    INTERPRETED = "interpreted"  # TRITON_INTERPRET=1: kernels run on the CPU, slowly
    UNAVAILABLE = "unavailable"  # no triton, or no way to run it here


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    type: str  # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] | None  # (major, minor) on CUDA, None on CPU
    sm_count: int  # multiprocessors on CUDA; CPU cores on CPU
    shared_mem_per_block: int  # bytes a block may opt into (0 on CPU)
    total_memory: int  # bytes of device memory (host memory on CPU, 0 if unknown)
    supports_bf16: bool
    triton: TritonMode

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def arch(self) -> str:
        """ "sm_90"-style name, or "cpu"."""
        if self.capability is None:
            return "cpu"
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.is_cuda else "cpu")


def triton_version(version: str) -> tuple[int, int]:
    """(major, minor) of a Triton version string ("3.8.0+git1a2b3c" -> (3, 8)); the kernels' feature gates
    compare it."""
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2])
    return major, minor


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreter_requested() -> bool:
    # Triton itself reads this variable at import; we only mirror its value.
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _cpu_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@functools.cache
def get_device_info(index: int | None = None) -> DeviceInfo:
    """Describe CUDA device `index` (default: current), or the CPU when CUDA is absent."""
    triton_ok = _triton_installed()
    if torch.cuda.is_available():
        idx = torch.cuda.current_device() if index is None else index
        props = torch.cuda.get_device_properties(idx)
        cap = (props.major, props.minor)
        smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
        if not triton_ok:
            mode = TritonMode.UNAVAILABLE
        elif _interpreter_requested():
            mode = TritonMode.INTERPRETED
        else:
            mode = TritonMode.COMPILED
        return DeviceInfo(
            type="cuda",
            name=props.name,
            capability=cap,
            sm_count=props.multi_processor_count,
            shared_mem_per_block=int(smem),
            total_memory=int(props.total_memory),
            supports_bf16=cap >= (8, 0),
            triton=mode,
        )
    mode = TritonMode.INTERPRETED if (triton_ok and _interpreter_requested()) else TritonMode.UNAVAILABLE
    return DeviceInfo(
        type="cpu",
        name="cpu",
        capability=None,
        sm_count=os.cpu_count() or 1,
        shared_mem_per_block=0,
        total_memory=_cpu_memory(),
        supports_bf16=True,
        triton=mode,
    )


def device_for(t: torch.Tensor) -> DeviceInfo:
    """The DeviceInfo of the device tensor `t` lives on (a CPU tensor on a GPU machine is a CPU)."""
    if t.is_cuda:
        return get_device_info(t.device.index)
    info = get_device_info()
    if not info.is_cuda:
        return info
    mode = TritonMode.INTERPRETED if _interpreter_requested() else TritonMode.UNAVAILABLE
    return DeviceInfo("cpu", "cpu", None, os.cpu_count() or 1, 0, 0, True, mode)
