"""The terminal chat over the real engine: streaming, /image, /reset, errors as messages."""

import asyncio
import io

import pytest

from vlchat.app.chat import TerminalChat, run_chat
from vlchat.app.errors import AppError, MediaError
from vlchat.app.model_choice import EXAMPLES
from vlchat.app.settings import MediaLimits

GREEDY = {"max_tokens": 6, "temperature": 0.0}


def test_answers_stream_and_images_attach_to_the_next_message(tiny_engine):
    chat = TerminalChat(tiny_engine, MediaLimits(), sampling=GREEDY)
    pieces = []
    answer = asyncio.run(chat.answer("Hello there", pieces.append))
    assert len(pieces) > 1 and "".join(pieces) == answer  # streamed, not written at once
    assert "attached" in chat.command(f"/image {EXAMPLES / 'one-shape.png'}")
    asyncio.run(chat.answer("What is this?", lambda _: None))
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 2
    assert [p["type"] for p in chat.messages[2]["content"]] == ["image", "text"] and chat.pending_images == []
    assert chat.command("/reset") == "(conversation reset)" and chat.messages == []
    assert chat.command("/exit") is None
    with pytest.raises(MediaError, match="no image file"):
        chat.command("/image /no/such.png")
    few = TerminalChat(tiny_engine, MediaLimits(max_images_per_request=1))
    few.command(f"/image {EXAMPLES / 'one-shape.png'}")
    with pytest.raises(AppError, match="at most 1 images"):
        few.command(f"/image {EXAMPLES / 'one-shape.png'}")


def test_run_chat_prints_errors_not_tracebacks(tiny_engine, tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    stdin = io.StringIO(f"/image {tmp_path / 'notes.txt'}\n/what\nHello\n/exit\n")
    stdout = io.StringIO()
    chat = TerminalChat(tiny_engine, MediaLimits(), sampling=GREEDY)
    assert asyncio.run(run_chat(chat, "tiny", stdin, stdout)) == 0
    out = stdout.getvalue()
    assert "error: the data is not a readable image" in out and "unknown command /what" in out
    assert "Traceback" not in out and len(chat.messages) == 2


def test_an_answer_cut_at_max_tokens_says_so(tiny_engine):
    from vlchat.app.chat import CUT_NOTE

    def run(max_tokens):
        chat = TerminalChat(tiny_engine, MediaLimits(), sampling={"max_tokens": max_tokens, "temperature": 0.0,
                                                                   "ignore_eos": True})  # fmt: skip
        stdout = io.StringIO()
        assert asyncio.run(run_chat(chat, "tiny", io.StringIO("Hello\n/exit\n"), stdout)) == 0
        return stdout.getvalue()

    assert CUT_NOTE in run(3)
