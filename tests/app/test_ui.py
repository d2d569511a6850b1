"""The UI's chat function: Gradio history -> engine messages, images in later turns, errors as warnings."""

import asyncio

import pytest

from vlchat.app.errors import AppError
from vlchat.app.model_choice import EXAMPLES
from vlchat.app.settings import MediaLimits, ServerConfig
from vlchat.app.ui import conversation, make_respond

ONE, TWO = str(EXAMPLES / "one-shape.png"), str(EXAMPLES / "two-shapes.png")


def file_part(path):
    return {"type": "file", "file": {"path": path, "mime_type": "image/png"}}


def test_history_with_images_in_several_turns():
    history = [  # what Gradio 6 passes: normalized messages, files and text as separate user messages
        {"role": "user", "content": [file_part(ONE)]},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A square."}]},
    ]
    message = {"text": "And this one?", "files": [{"path": TWO}]}
    messages = conversation(message, history, "Be brief.", MediaLimits())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    first, last = messages[1]["content"], messages[3]["content"]
    assert [p["type"] for p in first] == ["image", "text"] and first[1]["text"] == "What is this?"
    assert [p["type"] for p in last] == ["image", "text"] and last[0]["image"].mode == "RGB"
    assert messages[2] == {"role": "assistant", "content": "A square."}


def test_conversation_limits():
    with pytest.raises(AppError, match="at most 1"):
        conversation({"text": "hi", "files": [ONE, TWO]}, [], "", MediaLimits(max_images_per_request=1))
    with pytest.raises(AppError, match="type a message"):
        conversation({"text": "  ", "files": []}, [], "", MediaLimits())


def test_respond_streams_and_turns_bad_files_into_warnings(tiny_engine, tmp_path):
    respond = make_respond(tiny_engine, ServerConfig())

    async def collect(message):
        return [text async for text in respond(message, [], "", 0.0, 1.0, 12)]

    texts = asyncio.run(collect({"text": "Hello", "files": [ONE]}))
    assert texts and all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    (tmp_path / "fake.png").write_bytes(b"not a png")
    with pytest.warns(UserWarning, match="not a readable image"):
        assert asyncio.run(collect({"text": "Hello", "files": [str(tmp_path / "fake.png")]})) == []
