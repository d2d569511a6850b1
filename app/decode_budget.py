"""The memory the whole server spends decoding images at once.

Each decode reserves its estimated peak (the decoded frame plus one working copy) before
touching a pixel and waits while the reservations of other decodes leave no room; a decode
larger than the whole budget runs alone. So however many requests carry images, the
transient decode memory stays within max(budget, the largest single decode).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from vlchat.app.errors import AppError


class ServerBusyError(AppError):
    status = 503
    error_type = "server_error"
    code = "server_busy"


class DecodeBudget:
    def __init__(self, max_bytes: int, wait_s: float) -> None:
        self.max_bytes = max_bytes
        self.wait_s = wait_s
        self.in_use = 0
        self._cond = threading.Condition()

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        with self._cond:
            fits = self._cond.wait_for(lambda: self.in_use == 0 or self.in_use + nbytes <= self.max_bytes, self.wait_s)
            if not fits:
                raise ServerBusyError(
                    f"the server is busy decoding other images (waited {self.wait_s:g} s); retry in a moment"
                )
            self.in_use += nbytes
        try:
            yield
        finally:
            with self._cond:
                self.in_use -= nbytes
                self._cond.notify_all()
