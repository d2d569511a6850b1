"""How the server process's C heap hands freed memory back.

glibc's malloc raises its mmap threshold after each large free (up to 32 MB), after which large
blocks come from per-thread arenas and stay resident once freed: images decoded in turn by
different worker threads then add up (three concurrent image requests peaked at ~750 MB more
than their ~300 MB working set). A fixed threshold keeps every block of 8 MB or more (Pillow's
image memory, large tensors) mmapped, so it is returned to the system when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024

log = logging.getLogger(__name__)


def return_large_frees_to_the_system() -> bool:
    """Fix glibc's mmap threshold; False (and nothing changed) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl and others have no mallopt semantics to rely on
    except (OSError, AttributeError, TypeError):
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not ok:
        log.warning("could not fix the malloc mmap threshold; freed image memory may stay resident")
    return ok
