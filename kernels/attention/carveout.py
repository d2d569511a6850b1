"""The shared-memory carveout of the split merge (`decode._reduce_kernel`), so that decode CTAs can start beside it.

An SM splits its on-chip memory between L1 and shared memory per kernel (the carveout; CUDA picks it from the
kernel's needs unless the kernel states a preference), and it changes the split only when it is idle. The reduce
kernel needs almost no shared memory, so its SMs run with a small carveout, and a CTA of a kernel that needs more
(the sm_90 Gluon decode kernel: 134 KB at one CTA per SM) cannot start on an SM where a reduce CTA still runs.
With programmatic dependent launch the reduce kernel is launched while the decode grid still runs (`decode_ws.py`
says when) and lets the next call's decode kernel launch at its start; with its preference set to the largest
shared-memory carveout, those decode CTAs start beside it on every SM instead of waiting for it to leave
(docs/PERF.md#gluon-sm_90-decode has what that saves).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref

logger = logging.getLogger(__name__)

_CARVEOUT_ATTRIBUTE = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
MAX_SHARED = 100  # CU_SHAREDMEM_CARVEOUT_MAX_SHARED: the percentage of the most shared memory the SM can have

_done: weakref.WeakSet = weakref.WeakSet()  # loaded kernels whose preference is set (or failed to set)


@functools.cache
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def prefer_max_shared(kernel) -> None:
    """Set a launched Triton kernel's (the CompiledKernel its launch returns) carveout preference to the most shared
    memory, once per loaded kernel: its first launch ran with CUDA's choice, the launches after it (and the CUDA
    graphs captured after it) run with the preference. A preference only moves time: where CUDA refuses it, a
    warning says so and the kernel keeps CUDA's choice."""
    if kernel in _done:
        return
    _done.add(kernel)
    err = _libcuda().cuFuncSetAttribute(ctypes.c_void_p(kernel.function), _CARVEOUT_ATTRIBUTE, ctypes.c_int(MAX_SHARED))
    if err != 0:
        logger.warning("cuFuncSetAttribute(preferred shared memory carveout) failed with CUresult %d", err)


def carveout(kernel) -> int:
    """The carveout preference of a launched Triton kernel as CUDA reports it (-1: none stated); the tests read it."""
    value = ctypes.c_int()
    err = _libcuda().cuFuncGetAttribute(ctypes.byref(value), _CARVEOUT_ATTRIBUTE, ctypes.c_void_p(kernel.function))
    if err != 0:
        raise RuntimeError(f"cuFuncGetAttribute(preferred shared memory carveout) failed with CUresult {err}")
    return value.value
