"""Saved chats: the browser's stored list, and a chat's round trip through the OpenAI messages JSON."""

import json

import pytest

from vlchat.app import ui_chats
from vlchat.app.errors import AppError
from vlchat.app.model_choice import EXAMPLES
from vlchat.app.settings import MediaLimits
from vlchat.app.ui_history import CUT_NOTE, assistant, from_openai, to_openai, user_turn

LIMITS = MediaLimits()


def a_chat(text="How many shapes are there?"):
    return [*user_turn(text, [str(EXAMPLES / "one-shape.png"), str(EXAMPLES / "two-shapes.png")]),
            assistant("There is one shape." + CUT_NOTE)]  # fmt: skip


def test_a_chat_round_trips_through_openai_messages_with_its_images():
    messages = to_openai(a_chat(), LIMITS)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert [p["type"] for p in messages[0]["content"]] == ["image_url", "image_url", "text"]
    assert messages[0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    back = from_openai(json.loads(json.dumps(messages)), LIMITS)
    assert [len(m["content"]) for m in back] == [1, 1, 1, 1]
    stored = back[0]["content"][0]["file"]["path"]
    assert open(stored, "rb").read() == (EXAMPLES / "one-shape.png").read_bytes()
    assert to_openai(back, LIMITS) == messages


def test_save_rename_delete_and_titles():
    store, first = ui_chats.save(ui_chats.empty(), None, to_openai(a_chat(), LIMITS))
    store, second = ui_chats.save(store, None, to_openai(a_chat("x" * 60), LIMITS))
    assert [c[1] for c in ui_chats.choices(store)] == [second, first]  # newest first
    assert ui_chats.choices(store)[0][0] == "x" * 39 + "…"
    store = ui_chats.rename(store, first, "  Shapes   chat ")
    store, _ = ui_chats.save(store, first, to_openai(a_chat("changed"), LIMITS))  # a renamed chat keeps its name
    assert ui_chats.choices(store) == [("Shapes chat", first), (ui_chats.choices(store)[1][0], second)]
    assert ui_chats.choices(ui_chats.delete(store, first)) == [(ui_chats.choices(store)[1][0], second)]
    with pytest.raises(AppError, match="type a name"):
        ui_chats.rename(store, first, "   ")
    assert ui_chats.save(store, None, []) == (store, None)  # an empty chat is not kept


def test_export_then_import_gives_the_same_chat(tmp_path):
    store, chat_id = ui_chats.save(ui_chats.empty(), None, to_openai(a_chat(), LIMITS))
    path = ui_chats.export_file(store, chat_id)
    title, messages = ui_chats.read_import(path, 10**7)
    assert title == "How many shapes are there?" and messages == ui_chats.find(store, chat_id)["messages"]


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"not json", "not JSON"),
        (b'{"messages": 3}', "JSON list of messages"),
        (b'[{"role": "robot", "content": "hi"}]', "message 0.role"),
        (b'[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]', "data: URLs"),
        (
            b'[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]',
            "not a readable image",
        ),
    ],
    ids=["not-json", "not-a-list", "bad-role", "server-path", "broken-image"],
)
def test_imports_that_cannot_be_used_say_why(tmp_path, content, needle):
    path = tmp_path / "chat.json"
    path.write_bytes(content)
    with pytest.raises(AppError, match=needle):
        _, messages = ui_chats.read_import(str(path), 10**7)
        from_openai(messages, LIMITS)
