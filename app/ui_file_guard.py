"""Guard the UI's API (`/gradio_api/...`) against file values that make Gradio read what it should not.

Gradio opens, copies or downloads any file value a request names: `{"path": P, "meta": {"_type":
"gradio.FileData"}}` in a message, or a Chatbot message part `{"component": "image", "value":
{"path": P}}` through `run/predict`. Its own check covers only some of those routes. So every JSON
body posted to the UI's API is parsed here (what is checked is the parsed value, so JSON escapes such
as `"\\u0068ttp://"` change nothing) and every object in it with a string "path" is checked:

- an http(s) URL: refused (403) unless the server runs with --allow-remote-images;
- any other path: allowed only inside Gradio's upload folder or the example image folders, after
  resolving symlinks; anything else is refused (403) with one message whether or not it exists.

A body that is not JSON, or nests deeper than MAX_DEPTH, is a 400. Multipart uploads pass untouched.
"""

from __future__ import annotations

import json
import os

from vlchat.app.api.errors import user_error_response
from vlchat.app.errors import AppError, ForbiddenMediaError

MAX_DEPTH = 64  # Gradio's own values nest a few levels; deeper is an attack on the parsers behind
REMOTE_MESSAGE = (
    "remote image URLs are disabled on this server; upload the image instead "
    "(or start the server with --allow-remote-images)"
)
LOCAL_MESSAGE = "the UI reads only files uploaded to it; upload the image instead of naming a server path"


class UiFileGuard:
    """ASGI middleware for POSTs under `prefix` (inside the body limit, so the bodies it reads are bounded)."""

    def __init__(self, app, allowed_dirs: list[str], allow_remote: bool, prefix: str = "/gradio_api/"):
        self.app, self.prefix, self.allow_remote = app, prefix, allow_remote
        self.allowed_dirs = [os.path.realpath(d) for d in allowed_dirs]

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(self.prefix):
            return await self.app(scope, receive, send)
        if path.endswith("/upload"):  # multipart file bytes, never a file value Gradio would open
            return await self.app(scope, receive, send)
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(chunks)
        error = self.check(body) if body.strip() else None
        if error is not None:
            return await user_error_response(error)(scope, receive, send)
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    def check(self, body: bytes) -> AppError | None:
        """The error to answer `body` with, or None when it may pass."""
        try:
            data = json.loads(body)
        except RecursionError:
            return AppError(f"the request body nests deeper than {MAX_DEPTH} levels")
        except ValueError:
            return AppError("the UI's API takes JSON request bodies; this one is not valid JSON")
        stack = [(data, 0)]
        while stack:
            item, depth = stack.pop()
            if depth > MAX_DEPTH:
                return AppError(f"the request body nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                path = item.get("path")
                if isinstance(path, str) and (error := self._check_path(path)):
                    return error
                stack.extend((value, depth + 1) for value in item.values())
            elif isinstance(item, list):
                stack.extend((value, depth + 1) for value in item)
        return None

    def _check_path(self, path: str) -> AppError | None:
        if path.strip().lower().startswith(("http://", "https://", "//")):
            return None if self.allow_remote else ForbiddenMediaError(REMOTE_MESSAGE)
        if "\x00" in path or "://" in path:
            return ForbiddenMediaError(LOCAL_MESSAGE)
        real = os.path.realpath(path)
        if any(os.path.commonpath([real, root]) == root for root in self.allowed_dirs):
            return None
        return ForbiddenMediaError(LOCAL_MESSAGE)
