"""Keep the UI from fetching remote files: Gradio downloads any http(s) URL named as a file value.

A request to the UI's API (`/gradio_api/queue/join`, `/gradio_api/call/chat`, ...) may carry a file
as `{"path": "https://...", "meta": {"_type": "gradio.FileData"}}`, and Gradio fetches it on the
server before the chat function runs. Without --allow-remote-images such requests are refused here.
"""

from __future__ import annotations

import json

from vlchat.app.api.errors import user_error_response
from vlchat.app.errors import ForbiddenMediaError

FILE_TYPE = "gradio.FileData"
MESSAGE = (
    "remote image URLs are disabled on this server; upload the image instead "
    "(or start the server with --allow-remote-images)"
)


class RemoteFileGuard:
    """ASGI middleware: a 403 for UI API requests whose file values are http(s) URLs."""

    def __init__(self, app, prefix: str = "/gradio_api/"):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(self.prefix):
            return await self.app(scope, receive, send)
        if path.endswith("/upload"):  # multipart file bytes, never a file value Gradio would fetch
            return await self.app(scope, receive, send)
        messages, body = [], b""
        while True:  # the body limit middleware outside this one bounds what is read here
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        if names_remote_file(body):
            return await user_error_response(ForbiddenMediaError(MESSAGE))(scope, receive, send)
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


def names_remote_file(body: bytes) -> bool:
    """True when a JSON body holds a Gradio file value whose path is an http(s) URL."""
    if b"http" not in body or FILE_TYPE.encode() not in body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False  # not JSON: nothing Gradio would read a file value from
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            meta = item.get("meta")
            if isinstance(meta, dict) and meta.get("_type") == FILE_TYPE:
                path = item.get("path")  # what Gradio fetches; "url" is where the browser sees an upload
                if isinstance(path, str) and path.strip().lower().startswith(("http://", "https://")):
                    return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
