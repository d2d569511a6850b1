"""The one place the kernels package reads environment variables.

`VLCHAT_KERNEL_BACKEND` (auto | triton | torch) forces an implementation for
every op (`triton`: our GPU kernels, the Gluon ones on sm_90 included); the
engine's config can set the same choice with `set_backend`.

`VLCHAT_LAUNCH_DIRECT=0` makes kernels/launch.py launch every kernel through
Triton's `kernel[grid]` (its per-call binding; for comparison, or should a
Triton version's internals differ), and `VLCHAT_LAUNCH_CHECK=1` check each
direct launch against Triton's own specialization.
"""

from __future__ import annotations

import contextlib
import os

BACKENDS = ("auto", "triton", "torch")

_backend = os.environ.get("VLCHAT_KERNEL_BACKEND", "auto").strip().lower() or "auto"


def _check(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"kernel backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    return name


_check(_backend)


def get_backend() -> str:
    return _backend


def set_backend(name: str) -> None:
    """Force `triton` or `torch` for every op, or go back to `auto`."""
    global _backend
    _backend = _check(name)


@contextlib.contextmanager
def forced(name: str):
    """`set_backend(name)` for the duration of a with-block, then the previous choice again."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


_launch_direct = os.environ.get("VLCHAT_LAUNCH_DIRECT", "1").strip() not in ("", "0")
_launch_check = os.environ.get("VLCHAT_LAUNCH_CHECK", "0").strip() not in ("", "0")


def launch_check() -> bool:
    """`VLCHAT_LAUNCH_CHECK=1`: kernels/launch.py checks every direct launch against Triton's own specialization
    (the GPU tests set it; it costs Triton's binding again on every call)."""
    return _launch_check


def launch_direct() -> bool:
    """Whether kernels/launch.py may launch compiled variants directly (`VLCHAT_LAUNCH_DIRECT`, default on)."""
    return _launch_direct


@contextlib.contextmanager
def launching_directly(on: bool):
    """Direct launches on or off for the duration of a with-block (benchmarks/launch.py compares the two in one
    process), then as they were."""
    global _launch_direct
    previous, _launch_direct = _launch_direct, bool(on)
    try:
        yield
    finally:
        _launch_direct = previous
