"""A browser conversation in its three forms: Chatbot messages, engine messages, and OpenAI messages JSON.

Chatbot form (what `gr.Chatbot` holds): one user message per attached image
(`{"type": "file", ...}` content) followed by one user message with the text, then one assistant
message. A turn's images are separate messages so that the Chatbot's edit box only ever holds text.
OpenAI form (saved chats, export/import, the /chat API's `history`): user content is a list of
`image_url` parts (data: URLs) and one text part; assistant content is a string.
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import TypeAdapter, ValidationError

from vlchat.app.api.protocol import ChatMessage, ImagePart
from vlchat.app.errors import AppError
from vlchat.app.generation import engine_message
from vlchat.app.media import decode_data_url, decode_image, load_image, load_images
from vlchat.app.settings import MediaLimits

# Appended to an answer that stopped at max new tokens; never sent back to the model.
CUT_NOTE = "\n\n*(answer cut at the Max new tokens limit; raise it in Generation settings and press Retry)*"
IMAGE_DIR = Path(tempfile.gettempdir()) / "vlchat-ui-images"


class HistoryMessage(ChatMessage):
    """A message of the /chat API's history: the roles a browser conversation has (no tool turns)."""

    role: Literal["system", "developer", "user", "assistant"]


_MESSAGES = TypeAdapter(list[HistoryMessage])


def file_path(item) -> str | None:
    """The local path of a Gradio file value (a str, a FileData dict or object)."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        inner = item.get("file", item)
        return inner.get("path") if isinstance(inner, dict) else getattr(inner, "path", None)
    return getattr(item, "path", None)


def parts_of(message: dict) -> list:
    """A Chatbot message's content as a list of text strings and image paths (`Path`)."""
    content = message.get("content")
    parts = []
    for part in content if isinstance(content, (list, tuple)) else [content]:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(part.get("text") or "")
        elif (path := file_path(part)) is not None:
            parts.append(Path(path))
    return parts


def user_turn(text: str, files: Sequence) -> list[dict]:
    """The Chatbot messages of one user turn: one per image, then the text (if any)."""
    messages = [{"role": "user", "content": [image_content(p)]} for p in map(file_path, files) if p]
    if text.strip():
        messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return messages


def image_content(path: str | os.PathLike) -> dict:
    mime = mimetypes.guess_type(str(path))[0] or "image/png"
    return {"type": "file", "file": {"path": str(path), "mime_type": mime, "meta": {"_type": "gradio.FileData"}}}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def turn_start(history: Sequence[dict], index: int) -> int:
    """The index of the first message of the user turn that holds message `index`."""
    while index > 0 and history[index - 1].get("role") == "user":
        index -= 1
    return index


def last_turn_start(history: Sequence[dict]) -> int | None:
    """Where the last user turn begins (None: there is none)."""
    users = [i for i, m in enumerate(history) if m.get("role") == "user"]
    return turn_start(history, users[-1]) if users else None


def turn_input(messages: Sequence[dict]) -> dict:
    """A user turn's messages back as the textbox's value {"text", "files"}."""
    parts = [p for m in messages for p in parts_of(m)]
    return {
        "text": "\n".join(p for p in parts if isinstance(p, str)),
        "files": [str(p) for p in parts if isinstance(p, Path)],
    }


def engine_messages(history: Sequence[dict], system_prompt: str, limits: MediaLimits) -> list[dict]:
    """Chatbot messages (the last turn included) -> engine messages; consecutive same-role messages merge."""
    turns: list[tuple[str, list]] = []
    for message in history:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        parts = parts_of(message)
        if role == "assistant":
            parts = [p.removesuffix(CUT_NOTE) for p in parts if isinstance(p, str)]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(parts)
        else:
            turns.append((role, parts))
    if not turns or turns[-1][0] != "user" or not any(isinstance(p, Path) or p.strip() for p in turns[-1][1]):
        raise AppError("type a message or attach an image first")
    total = sum(isinstance(p, Path) for _, parts in turns for p in parts)
    if total > limits.max_images_per_request:
        raise AppError(
            f"this conversation has {total} images; at most {limits.max_images_per_request} fit one request. "
            "Start a new chat (or remove images with Undo)."
        )
    messages = [{"role": "system", "content": system_prompt.strip()}] if system_prompt.strip() else []
    paths = [p for _, parts in turns for p in parts if isinstance(p, Path)]
    images = iter(load_images(paths, limits, trusted_path=True))  # one request: its pixel budget covers them all
    for role, parts in turns:
        messages.append(engine_message(role, [next(images) if isinstance(p, Path) else p for p in parts]))
    return messages


def to_openai(history: Sequence[dict], limits: MediaLimits) -> list[dict]:
    """Chatbot messages -> OpenAI messages with the images inline as data: URLs (saved chats, export)."""
    out: list[dict] = []
    for message in history:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        parts = parts_of(message)
        if role == "assistant":
            text = "".join(p for p in parts if isinstance(p, str))
            if out and out[-1]["role"] == "assistant":
                out[-1]["content"] += text
            else:
                out.append({"role": "assistant", "content": text})
            continue
        if not out or out[-1]["role"] != "user":
            out.append({"role": "user", "content": []})
        for p in parts:
            if isinstance(p, Path):
                out[-1]["content"].append({"type": "image_url", "image_url": {"url": _data_url(p, limits)}})
            elif p:
                out[-1]["content"].append({"type": "text", "text": p})
    for message in out:  # text-only user turns as plain strings, as most clients write them
        if message["role"] == "user" and all(p["type"] == "text" for p in message["content"]):
            message["content"] = "\n".join(p["text"] for p in message["content"])
    return out


def validate_openai(messages) -> list[ChatMessage]:
    """Check OpenAI messages (imported or sent as `history`); the error says which message is wrong."""
    if isinstance(messages, dict) and "messages" in messages:
        messages = messages["messages"]
    if not isinstance(messages, list):
        raise AppError('a conversation is a JSON list of messages ({"role": ..., "content": ...}) '
                       'or an object with a "messages" list')  # fmt: skip
    try:
        return _MESSAGES.validate_python(messages)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][:3])
        raise AppError(f"message {where}: {first['msg']}; see docs/UI.md for the format") from None


def from_openai(messages, limits: MediaLimits) -> list[dict]:
    """OpenAI messages -> Chatbot messages; images must be data: URLs and are written to IMAGE_DIR."""
    history: list[dict] = []
    for message in validate_openai(messages):
        if message.role not in ("user", "assistant"):
            continue  # the system prompt lives in Generation settings
        if message.role == "assistant" or isinstance(message.content, str) or message.content is None:
            text = message.content if isinstance(message.content, str) else "".join(
                p.text for p in message.content or [] if not isinstance(p, ImagePart))  # fmt: skip
            history += [assistant(text)] if message.role == "assistant" else user_turn(text, [])
            continue
        files = [store_image(p.image_url.url, limits) for p in message.content if isinstance(p, ImagePart)]
        text = "\n".join(p.text for p in message.content if not isinstance(p, ImagePart))
        history += user_turn(text, files)
    return history


def openai_to_engine(messages, limits: MediaLimits) -> list[dict]:
    """OpenAI messages from an untrusted caller -> engine messages (images: data: URLs, or what `limits` allow)."""
    out = []
    for message in validate_openai(messages):
        role = "system" if message.role == "developer" else message.role
        if isinstance(message.content, list):
            parts = [
                load_image(p.image_url.url, limits) if isinstance(p, ImagePart) else p.text for p in message.content
            ]
            out.append(engine_message(role, parts))
        else:
            out.append(engine_message(role, [message.content or ""]))
    return out


def store_image(url: str, limits: MediaLimits) -> str:
    """Write a data: URL image to IMAGE_DIR (named by its content) after checking that it is a usable image."""
    if not url.startswith("data:"):
        raise AppError("saved and imported conversations carry their images as data: URLs; this one has "
                       f"{url[:40]!r}")  # fmt: skip
    data = decode_data_url(url, limits)
    decode_image(data, limits)
    mime = url[len("data:") :].split(";", 1)[0].lower()
    name = hashlib.sha256(data).hexdigest()[:32] + (mimetypes.guess_extension(mime) or ".png")
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    path = IMAGE_DIR / name
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def _data_url(path: Path, limits: MediaLimits) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        raise AppError(f"the image {path.name} of this chat is gone from the server; it cannot be saved") from None
    if len(data) > limits.max_image_bytes:
        raise AppError(f"the image {path.name} is larger than the {limits.max_image_bytes} byte limit")
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
