"""The UI's queued jobs: a job whose results nobody reads is stopped, and a full queue answers "busy".

Gradio runs a job posted to `/gradio_api/call/<api>` or `/gradio_api/queue/join` whether or not anyone
reads its results. When a reader leaves, Gradio closes the job's generator at its next update (whose
`finally` aborts the engine request), but a job whose results were never asked for ran to its end. So
the result streams are counted here, `GET /gradio_api/call/<api>/<event_id>` by event id and
`GET /gradio_api/queue/data?session_hash=H` by session, from the moment they answer 200 until they end;
and a UI job's engine stream (`ResultReaders.while_read`) stops, aborting the engine request, when no
reader came within `wait_s` of the job's start or the last one left (also while the request is still
waiting in the engine, before its first update).

Past the queue bound (`Blocks.queue(max_size)`) Gradio answers 503 {"detail": "Queue is full. ..."};
`UiJobRoutes` turns that into an error body that says the server is busy, with Retry-After. Gradio's
own clients key on the 503 only (the browser shows "This application is currently busy").
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

from vlchat.app.api.errors import user_error_response
from vlchat.app.decode_budget import ServerBusyError

log = logging.getLogger("vlchat.ui")

RETRY_AFTER_S = 5
_RESULT_STREAM = re.compile(r"call/(?:v2/)?[^/]+/([^/]+)/?")
_JOIN = re.compile(r"queue/join/?|call/(?:v2/)?[^/]+/?")


class ResultReaders:
    """How many clients read each UI job's results now, keyed by event id and by session hash."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._reading: Counter[str] = Counter()
        self._waiters: set[asyncio.Future] = set()

    def reading(self, keys: tuple[str, ...]) -> bool:
        return any(self._reading[key] > 0 for key in keys)

    def opened(self, key: str) -> None:
        self._reading[key] += 1
        self._changed()

    def closed(self, key: str) -> None:
        self._reading[key] -= 1
        if self._reading[key] <= 0:
            del self._reading[key]
        self._changed()

    def _changed(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def abandoned(self, keys: tuple[str, ...]) -> None:
        """Return once nobody reads the results of `keys`: no reader within `wait_s`, or the last one left."""
        loop = asyncio.get_running_loop()
        deadline, seen = loop.time() + self.wait_s, False
        while True:
            if self.reading(keys):
                seen = True
            elif seen or loop.time() >= deadline:
                return
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait({waiter}, timeout=None if seen else deadline - loop.time())
            finally:
                self._waiters.discard(waiter)

    async def while_read(self, outputs: AsyncIterator, keys: tuple[str, ...]) -> AsyncIterator:
        """`outputs` (an engine stream that aborts its request when closed) for as long as someone reads the
        results of the job `keys` name; without keys (not run by Gradio's queue), all of it."""
        if not keys:
            async for output in outputs:
                yield output
            return
        gone = asyncio.ensure_future(self.abandoned(keys))
        step = None
        try:
            while True:
                step = asyncio.ensure_future(anext(outputs))
                await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    log.info("UI job %s: nobody reads its results; stopping it", keys[0])
                    return
                try:
                    output = step.result()
                except StopAsyncIteration:
                    return
                yield output
        finally:
            gone.cancel()
            if step is not None and not step.done():  # cancelled mid-step: the stream's own finally aborts
                step.cancel()
                await asyncio.wait({step})
                if not step.cancelled():
                    step.exception()
            await outputs.aclose()


def current_job() -> tuple[str, ...]:
    """The event id and session hash of the Gradio job running this code (empty outside one)."""
    from gradio.context import LocalContext

    event_id = LocalContext.event_id.get(None)
    request = LocalContext.request.get(None)
    session = getattr(request, "session_hash", None) if request is not None else None
    return tuple(key for key in (event_id, session) if key)


class UiJobRoutes:
    """ASGI middleware for the UI's job routes: counts result-stream readers, rewrites Gradio's queue-full answer."""

    def __init__(self, app, readers: ResultReaders, queue_size: int, prefix: str = "/gradio_api/") -> None:
        self.app, self.readers, self.queue_size, self.prefix = app, readers, queue_size, prefix

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(self.prefix):
            return await self.app(scope, receive, send)
        route = path[len(self.prefix) :]
        if scope["method"] == "GET" and (key := self._reader_key(route, scope)) is not None:
            return await self._read(key, scope, receive, send)
        if scope["method"] == "POST" and _JOIN.fullmatch(route):
            return await self.app(scope, receive, self._busy_answer(send))
        return await self.app(scope, receive, send)

    @staticmethod
    def _reader_key(route: str, scope) -> str | None:
        if route.rstrip("/") == "queue/data":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return (query.get("session_hash") or [None])[0]
        match = _RESULT_STREAM.fullmatch(route)
        return match.group(1) if match else None

    async def _read(self, key: str, scope, receive, send):
        counted = False

        async def counting_send(message):
            nonlocal counted
            if message["type"] == "http.response.start" and message["status"] == 200 and not counted:
                counted = True  # only a stream that answers counts: not a 401 or a 404
                self.readers.opened(key)
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if counted:
                self.readers.closed(key)

    def _busy_answer(self, send):
        held, chunks = None, []

        async def rewriting_send(message):
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 503:
                held = message  # what it is shows in the body
                return
            if held is None:
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if b"Queue is full" not in body:
                await send(held)
                return await send({"type": "http.response.body", "body": body})
            busy = user_error_response(ServerBusyError(
                f"the server is busy: the UI queue is full ({self.queue_size} chats waiting); "
                f"retry in {RETRY_AFTER_S} s"))  # fmt: skip
            busy.headers["Retry-After"] = str(RETRY_AFTER_S)
            await send({"type": "http.response.start", "status": 503, "headers": busy.raw_headers})
            await send({"type": "http.response.body", "body": busy.body})

        return rewriting_send
