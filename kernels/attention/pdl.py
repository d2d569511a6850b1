"""Programmatic dependent launch (sm_90 and newer, the arch table's `pdl`): a decode step's kernels start while
the kernel before them still runs and wait (griddepcontrol.wait) only before reading what it writes. `decode.py`
says what each kernel does before its wait; tests/kernels/test_dependent_launch.py checks the compiled order
(through tests/kernels/sm90_ptx.py) and that results do not change."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import triton
import triton.language as tl

from vlchat.kernels.attention.configs import TABLES, table_for
from vlchat.kernels.device import DeviceInfo, TritonMode

try:  # Triton >= 3.4: programmatic dependent launch (griddepcontrol, the launch_pdl option)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton, or none: the kernels launch without it
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def launch_next_then_wait(PDL: tl.constexpr):
    """With PDL: let the next kernel launch now, then wait until the kernel before has finished and its writes
    are visible. A kernel calls it before its first read of another kernel's output and before its first store
    (nothing when launched without dependent launch)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def dependent_launch(device: DeviceInfo) -> bool:
    """Whether decode's kernels launch on `device` with programmatic dependent launch (the arch table's `pdl`):
    compiled kernels on a GPU only (the interpreter has no griddepcontrol), with a Triton that has it."""
    compiled = device.is_cuda and device.triton == TritonMode.COMPILED
    return compiled and gdc_wait is not None and table_for(device).pdl


def pdl_options(pdl: bool) -> dict:
    """The launch option of programmatic dependent launch, for a Triton kernel's launch (none without it: a Triton
    older than 3.4 knows no `launch_pdl`)."""
    return {"launch_pdl": True} if pdl else {}


@contextlib.contextmanager
def without_dependent_launch(device: DeviceInfo):
    """`device`'s arch table with `pdl` off for the duration of a with-block, then as it was (the attention
    benchmark and the tests time and compare the two)."""
    arch = table_for(device).arch
    kept = TABLES[arch]
    TABLES[arch] = replace(kept, pdl=False)
    try:
        yield
    finally:
        TABLES[arch] = kept
