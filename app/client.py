"""A small Python client for a vlchat server (or any OpenAI-compatible chat API), sync and async.

from vlchat.app.client import Client
client = Client("http://127.0.0.1:7860")
print(client.chat("What is in this picture?", images=["cat.png"]))
for delta in client.chat("Tell me a story", stream=True, max_tokens=64):
    print(delta, end="", flush=True)
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx
from PIL import Image

ImageInput = str | os.PathLike | bytes | Image.Image


class ClientError(RuntimeError):
    """The server refused the request; `status` is the HTTP status, the message is the server's."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ImageNotFoundError(FileNotFoundError):
    """An image given by path does not exist here (the client reads it and sends its bytes)."""

    def __init__(self, path: str):
        super().__init__(
            f"no image file at {path!r}; pass an existing path, an http(s) or data: URL, bytes or a PIL image"
        )
        self.path = path


def image_url(image: ImageInput) -> str:
    """A URL the API accepts for `image`: http(s) and data: URLs pass through, anything else becomes a data: URL."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return _data_url(buffer.getvalue(), "image/png")
    if isinstance(image, (bytes, bytearray)):
        return _data_url(bytes(image), _sniff_mime(bytes(image)))
    if not isinstance(image, (str, os.PathLike)):
        raise TypeError(f"an image is a path, URL, bytes or PIL image, not {type(image).__name__}")
    text = os.fspath(image)
    if text.startswith(("http://", "https://", "data:")):
        return text
    try:
        with open(text, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ImageNotFoundError(text) from None
    return _data_url(data, _sniff_mime(data))


def api_message(message: dict) -> dict:
    """A history message in the API's form: {"type": "image", "image": ...} parts become image_url parts."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_url(part["image"])}})
        else:
            parts.append(part)
    return {**message, "content": parts}


def build_request(
    text: str,
    images: Sequence[ImageInput] | None,
    stream: bool,
    model: str | None,
    system: str | None,
    history: Sequence[dict] | None,
    sampling: dict,
) -> dict:
    if isinstance(images, (str, bytes, os.PathLike, Image.Image)):
        images = [images]  # one image given without a list
    content: list[dict] = [{"type": "image_url", "image_url": {"url": image_url(i)}} for i in images or ()]
    content.append({"type": "text", "text": text})
    messages = [{"role": "system", "content": system}] if system else []
    messages += [api_message(m) for m in history or []] + [{"role": "user", "content": content}]
    body = {"messages": messages, "stream": stream, **sampling}
    if model:
        body["model"] = model
    return body


def _data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _sniff_mime(data: bytes) -> str:
    signatures = {b"\x89PNG": "image/png", b"\xff\xd8": "image/jpeg", b"GIF8": "image/gif", b"BM": "image/bmp"}
    for magic, mime in signatures.items():
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code < 400:
        return
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:500]
    raise ClientError(response.status_code, message)


def _delta(line: str) -> str | None:
    """The text in one SSE line; None at [DONE]."""
    if not line.startswith("data:"):
        return ""
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    event = json.loads(payload)
    if "error" in event:
        raise ClientError(500, event["error"]["message"])
    return "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices", []))


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Blocking client. `chat` returns the answer text, or with stream=True an iterator of text deltas."""

    def __init__(self, base_url: str = "http://127.0.0.1:7860", api_key: str | None = None, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=_headers(api_key), timeout=timeout)

    def models(self) -> list[str]:
        response = self._http.get("/v1/models")
        _raise_for(response, response.content)
        return [m["id"] for m in response.json()["data"]]

    def chat(
        self,
        text: str,
        images: Sequence[ImageInput] | None = (),
        stream: bool = False,
        *,
        model: str | None = None,
        system: str | None = None,
        history: Sequence[dict] | None = None,
        **sampling,
    ) -> str | Iterator[str]:
        """Ask `text` about `images` (paths, PIL images, bytes or URLs); sampling: max_tokens, temperature, ..."""
        body = build_request(text, images, stream, model, system, history, sampling)
        if stream:
            return self._stream(body)
        response = self._http.post("/v1/chat/completions", json=body)
        _raise_for(response, response.content)
        return response.json()["choices"][0]["message"]["content"]

    def _stream(self, body: dict) -> Iterator[str]:
        with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            _raise_for(response, response.read() if response.status_code >= 400 else b"")
            for line in response.iter_lines():
                delta = _delta(line)
                if delta is None:
                    return
                if delta:
                    yield delta

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of `Client`: `await chat(...)`, or `async for delta in await chat(..., stream=True)`."""

    def __init__(self, base_url: str = "http://127.0.0.1:7860", api_key: str | None = None, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(api_key), timeout=timeout)

    async def models(self) -> list[str]:
        response = await self._http.get("/v1/models")
        _raise_for(response, response.content)
        return [m["id"] for m in response.json()["data"]]

    async def chat(
        self,
        text: str,
        images: Sequence[ImageInput] | None = (),
        stream: bool = False,
        *,
        model: str | None = None,
        system: str | None = None,
        history: Sequence[dict] | None = None,
        **sampling,
    ) -> str | AsyncIterator[str]:
        body = build_request(text, images, stream, model, system, history, sampling)
        if stream:
            return self._stream(body)
        response = await self._http.post("/v1/chat/completions", json=body)
        _raise_for(response, response.content)
        return response.json()["choices"][0]["message"]["content"]

    async def _stream(self, body: dict) -> AsyncIterator[str]:
        async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            _raise_for(response, await response.aread() if response.status_code >= 400 else b"")
            async for line in response.aiter_lines():
                delta = _delta(line)
                if delta is None:
                    return
                if delta:
                    yield delta

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
