"""Saved conversations: the list the browser keeps in its local storage, and the edits the sidebar makes to it.

The stored value is {"chats": [{"id", "title", "messages"}]}, newest first, `messages` in the OpenAI
form with images as data: URLs (app/ui_history.py), so a chat survives a reload and a server restart.
Browsers keep about 5 MB per site: chats with large photos may not fit.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

from vlchat.app.errors import AppError

STORAGE_KEY = "vlchat-chats"
TITLE_CHARS = 40
EXPORT_DIR = Path(tempfile.gettempdir()) / "vlchat-ui-exports"


def empty() -> dict:
    return {"chats": []}


def chats(store) -> list[dict]:
    return list((store or {}).get("chats") or []) if isinstance(store, dict) else []


def title_of(messages: list[dict]) -> str:
    """The first user text, shortened; "Image chat" when the first turn is only images."""
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []
                                                             if p.get("type") == "text"]  # fmt: skip
        text = " ".join(" ".join(texts).split())
        if text:
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
        return "Image chat"
    return "New chat"


def choices(store) -> list[tuple[str, str]]:
    """(title, id) pairs for the sidebar, newest first."""
    return [(chat["title"], chat["id"]) for chat in chats(store)]


def find(store, chat_id: str | None) -> dict | None:
    return next((chat for chat in chats(store) if chat["id"] == chat_id), None)


def save(store, chat_id: str | None, messages: list[dict]) -> tuple[dict, str | None]:
    """Store `messages` as chat `chat_id` (a new chat when None) and move it to the top; an empty chat is not kept."""
    if not messages:
        return {"chats": chats(store)}, chat_id
    chat_id = chat_id or uuid.uuid4().hex[:12]
    old = find(store, chat_id)
    title = old["title"] if old and old.get("renamed") else title_of(messages)
    chat = {**(old or {}), "id": chat_id, "title": title, "messages": messages}
    return {"chats": [chat] + [c for c in chats(store) if c["id"] != chat_id]}, chat_id


def rename(store, chat_id: str | None, title: str) -> dict:
    title = " ".join(title.split())
    if chat_id is None or find(store, chat_id) is None:
        raise AppError("pick a chat in the list first, then type its new name")
    if not title:
        raise AppError("type a name for the chat")
    return {"chats": [{**c, "title": title, "renamed": True} if c["id"] == chat_id else c for c in chats(store)]}


def delete(store, chat_id: str | None) -> dict:
    return {"chats": [c for c in chats(store) if c["id"] != chat_id]}


def export_file(store, chat_id: str | None) -> str:
    """Write chat `chat_id` as OpenAI messages JSON; returns the file's path."""
    chat = find(store, chat_id)
    if chat is None:
        raise AppError("pick a saved chat to export (a chat is saved after its first answer)")
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() else "-" for ch in chat["title"]).strip("-")[:30] or "chat"
    path = EXPORT_DIR / f"{safe}-{chat['id']}.json"
    path.write_text(json.dumps({"title": chat["title"], "messages": chat["messages"]}, ensure_ascii=False, indent=1))
    return str(path)


def read_import(path: str, max_bytes: int) -> tuple[str | None, object]:
    """(title or None, messages) from an uploaded JSON file: a list of messages or {"title", "messages"}."""
    data = Path(path).read_bytes()
    if len(data) > max_bytes:
        raise AppError(f"the file is larger than {max_bytes} bytes; import a smaller conversation")
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise AppError(
            "the file is not JSON; import a conversation exported by vlchat or an OpenAI messages list"
        ) from None
    if isinstance(value, dict):
        title = value.get("title") if isinstance(value.get("title"), str) else None
        return title, value.get("messages")
    return None, value
