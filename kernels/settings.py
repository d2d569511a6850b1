"""The one place the kernels package reads environment variables.

`VLCHAT_KERNEL_BACKEND` (auto | triton | torch) forces an implementation for
every op (`triton`: our GPU kernels, the Gluon ones on sm_90 included); the
engine's config can set the same choice with `set_backend`.
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
