"""uvicorn's h11 protocol with the timeouts and caps a server facing slow or hostile clients needs.

- A request head (request line and headers) must arrive whole within HEADER_TIMEOUT_S of its
  first byte: a client trickling headers gets 408 and the connection closes.
- While a request body is read, BODY_IDLE_TIMEOUT_S may pass between two reads at most (the
  client stopped sending): the connection closes and the handler sees a disconnect. Time the
  server itself holds reading back (flow control) does not count.
- One client address may hold MAX_CONNECTIONS_PER_CLIENT connections at once; more are answered
  503 and closed. Loopback counts as one address (a local proxy, the tests), so the cap is generous.

Idle keep-alive connections are closed by uvicorn's own keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 30.0
MAX_CONNECTIONS_PER_CLIENT = 512

_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
             b"content-length: 52\r\n\r\ntoo many connections from this address; retry later\n")  # fmt: skip


class GuardedH11Protocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    body_idle_timeout_s = BODY_IDLE_TIMEOUT_S
    max_connections_per_client = MAX_CONNECTIONS_PER_CLIENT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._guard_timer: asyncio.TimerHandle | None = None
        self._head_started = False
        counts = _per_client(self.server_state)
        self._address = self.client[0] if self.client else None
        counts[self._address] += 1
        if counts[self._address] > self.max_connections_per_client:
            transport.write(_TOO_MANY)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        counts = _per_client(self.server_state)
        counts[self._address] -= 1
        if counts[self._address] <= 0:
            del counts[self._address]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:  # part of a request head: one deadline for all of it
            if not self._head_started and self.conn.trailing_data[0]:
                self._head_started = True
                self._arm(self.header_timeout_s, self._head_timed_out)
        elif state is h11.SEND_BODY:  # each read of the body restarts the idle clock
            self._head_started = False
            self._arm(self.body_idle_timeout_s, self._body_timed_out)
        else:  # the request is in: the response is the application's business
            self._head_started = False
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._head_started = False  # the next request head, if any, gets its own deadline

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._guard_timer = asyncio.get_running_loop().call_later(seconds, callback)

    def _disarm(self) -> None:
        if getattr(self, "_guard_timer", None) is not None:
            self._guard_timer.cancel()
            self._guard_timer = None

    def _head_timed_out(self) -> None:
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.write(_REQUEST_TIMEOUT)
            self.transport.close()

    def _body_timed_out(self) -> None:
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        if self.flow is not None and self.flow.read_paused:  # we stopped reading, not the client
            self._arm(self.body_idle_timeout_s, self._body_timed_out)
            return
        self.transport.close()  # the handler reading the body sees the client leave


def _per_client(server_state) -> Counter:
    counts = getattr(server_state, "vlchat_connections_per_client", None)
    if counts is None:
        counts = Counter()
        server_state.vlchat_connections_per_client = counts
    return counts
