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


def test_a_conversations_images_share_the_request_pixel_budget():
    """The UI sends a whole conversation as one request: its images together are held to max_request_pixels."""
    history = [{"role": "user", "content": [file_part(ONE)]}, {"role": "assistant", "content": "A square."}]
    one = conversation({"text": "And this?", "files": [ONE]}, [], "", MediaLimits())[0]["content"][0]["image"]
    limits = MediaLimits(max_request_pixels=2 * one.width * one.height - 1)
    assert conversation({"text": "And this?", "files": [ONE]}, [], "", limits)
    with pytest.raises(AppError, match="pixels together"):
        conversation({"text": "And this?", "files": [TWO]}, history, "", limits)


def test_respond_streams_and_turns_bad_files_into_warnings(tiny_engine, tmp_path):
    respond = make_respond(tiny_engine, ServerConfig())

    async def collect(message):
        return [text async for text in respond(message, [], "", 0.0, 1.0, 12)]

    texts = asyncio.run(collect({"text": "Hello", "files": [ONE]}))
    assert texts and all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    (tmp_path / "fake.png").write_bytes(b"not a png")
    with pytest.warns(UserWarning, match="not a readable image"):
        assert asyncio.run(collect({"text": "Hello", "files": [str(tmp_path / "fake.png")]})) == []


def run_turn(engine, message, history, settings=("", 0.0, 1.0, 12), config=None):
    """One browser turn through the UI's send handler: (the (textbox, chat) updates, the warnings shown)."""
    import warnings

    from vlchat.app.ui import make_turns

    send = make_turns(engine, config or ServerConfig())[0]

    async def collect():
        return [update async for update in send(message, list(history), *settings)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        updates = asyncio.run(collect())
    return updates, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_refused_turn_leaves_the_chat_as_it_was_and_the_next_one_works(tiny_engine, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"these bytes are not a picture")
    bad = {"text": "What is this?", "files": [str(tmp_path / "broken.png")]}
    updates, warned = run_turn(tiny_engine, bad, [])
    ((textbox, chat),) = updates
    assert chat == [] and textbox["value"] == bad and len(warned) == 1 and "not a readable image" in warned[0]

    good = {"text": "Hello!", "files": [ONE]}
    updates, warned = run_turn(tiny_engine, good, chat)
    final = updates[-1][1]
    assert not warned and [m["role"] for m in final] == ["user", "user", "assistant"]
    assert final[-1]["content"][0]["text"]


def test_an_over_long_paste_is_refused_and_kept_in_the_box(tiny_engine):
    history = run_turn(tiny_engine, {"text": "Hello!", "files": []}, [])[0][-1][1]
    paste = {"text": "word " * 5000, "files": []}
    updates, warned = run_turn(tiny_engine, paste, history)
    ((textbox, chat),) = updates[-1:]
    assert chat == history and textbox["value"] == paste and len(warned) == 1 and "context" in warned[0]
    again, warned = run_turn(tiny_engine, {"text": "Hello!", "files": []}, chat)
    assert not warned and len(again[-1][1]) == 4


def test_a_spaces_only_message_adds_nothing(tiny_engine):
    updates, warned = run_turn(tiny_engine, {"text": "   ", "files": []}, [])
    assert updates[-1][1] == [] and len(warned) == 1 and "type a message" in warned[0]


def test_an_answer_cut_by_max_new_tokens_says_so_and_the_note_never_reaches_the_model(tiny_engine):
    from vlchat.app.ui_history import CUT_NOTE, engine_messages

    config = ServerConfig(sampling_defaults={"ignore_eos": True})
    updates, _ = run_turn(tiny_engine, {"text": "Hello!", "files": []}, [], ("", 0.0, 1.0, 3), config)
    chat = updates[-1][1]
    assert chat[-1]["content"][0]["text"].endswith(CUT_NOTE)
    later = engine_messages([*chat, {"role": "user", "content": [{"type": "text", "text": "more"}]}], "", MediaLimits())
    assert CUT_NOTE not in later[1]["content"]


def test_every_image_of_a_message_reaches_the_model(tiny_engine):
    messages = conversation({"text": "Compare them.", "files": [ONE, TWO]}, [], "", MediaLimits())
    prompt = tiny_engine.engine.normalize_prompt(messages, {"max_images": 8})
    assert len(prompt.images) == 2 and prompt.images[0].hash != prompt.images[1].hash


def test_more_than_eight_images_pass_when_the_server_allows_them(tiny_engine):
    config = ServerConfig(media=MediaLimits(max_images_per_request=10))
    updates, warned = run_turn(tiny_engine, {"text": "Count them.", "files": [ONE] * 9}, [], config=config)
    assert not warned and updates[-1][1][-1]["role"] == "assistant"
