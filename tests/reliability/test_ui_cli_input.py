"""The bad inputs of issue 10 through the browser UI's chat function and the command line: a message, never a traceback.

The UI handler (`app.ui.make_respond`) is driven directly, as Gradio drives it: user errors must
become `gr.Warning` toasts (a UserWarning outside a Gradio request) naming the problem, never the
"Generation failed" message kept for internal errors. The terminal chat reads its input from a
stream, and `vlchat serve`/`vlchat chat` with bad options exit with status 2 and one line.
"""

from __future__ import annotations

import asyncio
import io
import re
import warnings

import pytest
from PIL import Image

from tests.images import animated_gif, encode, odd_modes, png_claiming, red_png
from tests.reliability.checks import wait_idle
from vlchat.app.chat import TerminalChat, run_chat
from vlchat.app.cli import main
from vlchat.app.settings import MediaLimits, ServerConfig
from vlchat.app.ui import make_respond

GREEDY = (0.0, 1.0, 6)  # temperature, top-p, max new tokens


def respond_once(engine, message, history=(), settings=GREEDY, config=None):
    """Run one UI chat turn; return (the texts it yielded, the warnings it raised)."""
    respond = make_respond(engine, config or ServerConfig(media=MediaLimits(max_images_per_request=2)))

    async def collect():
        return [text async for text in respond(message, list(history), "", *settings)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = asyncio.run(collect())
    return texts, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui-uploads")
    files = {
        "not-an-image": b"just some text, not pixels",
        "empty": b"",
        "truncated-png": encode(Image.new("RGB", (64, 64), "blue"))[:70],
        "truncated-jpeg": encode(Image.new("RGB", (64, 64), "blue"), "JPEG")[:300],
        "zero-pixels": png_claiming(0, 16),
        "decompression-bomb": png_claiming(50_000, 50_000),
        "extreme-aspect-ratio": red_png((1, 20_000)),
    }
    for name, data in files.items():
        (root / f"{name}.png").write_bytes(data)
    return root


UI_FILE_CASES = [
    ("not-an-image", "not a readable image"),
    ("empty", "empty"),
    ("truncated-png", "not a readable image"),
    ("truncated-jpeg", "not a readable image"),
    ("zero-pixels", "image"),
    ("decompression-bomb", "pixels"),
    ("extreme-aspect-ratio", "aspect ratio"),
    ("missing-file", "no image file"),
]


@pytest.mark.parametrize("name, needle", UI_FILE_CASES, ids=[c[0] for c in UI_FILE_CASES])
def test_ui_bad_uploads_are_warnings(vlm_engine, bad_files, name, needle):
    texts, warned = respond_once(vlm_engine, {"text": "What is this?", "files": [str(bad_files / f"{name}.png")]})
    assert texts == [] and len(warned) == 1 and needle in warned[0], warned
    wait_idle(vlm_engine)


UI_MESSAGE_CASES = [
    ("empty-message", {"text": "   ", "files": []}, GREEDY, "type a message"),
    ("too-many-images", {"text": "hi", "files": ["a.png", "b.png", "c.png"]}, GREEDY, "at most 2"),
    ("image-token-typed", {"text": "look: <image> what?", "files": []}, GREEDY, "image placeholder"),
    ("lone-surrogate", {"text": "hi \udcff there", "files": []}, GREEDY, "unicode"),
    ("prompt-over-context", {"text": "hello " * 700, "files": []}, GREEDY, "context"),
    ("max-new-tokens-zero", {"text": "hi", "files": []}, (0.0, 1.0, 0), "max_tokens"),
    ("temperature-negative", {"text": "hi", "files": []}, (-1.0, 1.0, 6), "temperature"),
    ("top-p-zero", {"text": "hi", "files": []}, (0.0, 0.0, 6), "top_p"),
]


@pytest.mark.parametrize("message, settings, needle", [c[1:] for c in UI_MESSAGE_CASES],
                         ids=[c[0] for c in UI_MESSAGE_CASES])  # fmt: skip
def test_ui_bad_messages_are_warnings(vlm_engine, message, settings, needle):
    texts, warned = respond_once(vlm_engine, message, settings=settings)
    assert texts == [] and len(warned) == 1 and needle in warned[0].lower(), warned
    assert "Generation failed" not in warned[0]
    wait_idle(vlm_engine)


def test_ui_odd_images_are_converted_and_answered(vlm_engine, tmp_path):
    for name, (data, _) in odd_modes().items():
        (tmp_path / f"{name}.img").write_bytes(data)
        texts, warned = respond_once(vlm_engine, {"text": "What is this?", "files": [str(tmp_path / f"{name}.img")]})
        assert texts and not warned, (name, warned)
    wait_idle(vlm_engine)


def test_ui_max_new_tokens_beyond_the_context_still_answers(vlm_engine):
    texts, warned = respond_once(vlm_engine, {"text": "Hello", "files": []}, settings=(0.0, 1.0, 10**6))
    assert texts and not warned, warned
    wait_idle(vlm_engine)


ODD_HISTORY = [
    ({"role": "tool", "content": "ignored"}, "message 0.role"),
    ({"role": "user", "content": None}, "needs content"),
    ({"role": "assistant", "content": [{"type": "weird"}, "plain text"]}, "'weird'"),
    ({"role": "user", "content": [{"type": "file"}]}, "'file'"),
    ({"no role": True}, "role"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}, "local file paths"),
]


@pytest.mark.parametrize("entry, needle", ODD_HISTORY, ids=[str(i) for i in range(len(ODD_HISTORY))])
def test_ui_api_odd_history_entries_are_named_in_a_warning(vlm_engine, entry, needle):
    # the /chat API's `history` is OpenAI messages from the caller: checked like a /v1 request, never trusted
    texts, warned = respond_once(vlm_engine, {"text": "Hello", "files": []}, history=[entry])
    assert texts == [] and len(warned) == 1 and needle in warned[0] and "Generation failed" not in warned[0], warned


def _chat(engine, stdin, **kw) -> tuple[int, str, TerminalChat]:
    chat = TerminalChat(engine, MediaLimits(), sampling={"max_tokens": 6, "temperature": 0.0}, **kw)
    stdout = io.StringIO()
    code = asyncio.run(asyncio.wait_for(run_chat(chat, "tiny", stdin, stdout), timeout=60))
    return code, stdout.getvalue(), chat


def test_terminal_chat_prints_one_error_line_per_bad_input(vlm_engine, bad_files, tmp_path):
    (tmp_path / "anim.gif").write_bytes(animated_gif())
    bad = [f"/image {bad_files / f'{name}.png'}" for name, _ in UI_FILE_CASES]
    lines = [*bad, "look: <image> what?", "hi \udcff there", "hello " * 700, f"/image {tmp_path / 'anim.gif'}", "Hello"]
    code, out, chat = _chat(vlm_engine, io.StringIO("\n".join(lines) + "\n/exit\n"))
    assert code == 0 and "Traceback" not in out
    errors = re.findall(r"error: (.*)", out)
    assert len(errors) == len(bad) + 3, out
    for (_, needle), error in zip(UI_FILE_CASES, errors, strict=False):
        assert needle in error, error
    assert "placeholder" in errors[-3] and "Unicode" in errors[-2] and "context" in errors[-1]
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]  # only the good turn, with its GIF
    wait_idle(vlm_engine)


def test_terminal_chat_survives_undecodable_input(vlm_engine):
    """Bytes that are not UTF-8 on stdin: the line is answered (bad bytes replaced), the chat goes on."""
    stdin = io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\xfe hello\nHello\n"), encoding="utf-8")
    code, out, chat = _chat(vlm_engine, stdin)
    assert code == 0 and "Traceback" not in out and "error" not in out
    assert len(chat.messages) == 4 and "\ufffd" in chat.messages[0]["content"]


CLI_CASES = [
    ("port-out-of-range", ["serve", "--port", "70000"], "--port"),
    ("auth-without-colon", ["serve", "--auth", "alice"], "--auth"),
    ("auth-empty-password", ["serve", "--auth", "alice:"], "--auth"),
    ("api-key-blank", ["serve", "--api-key", "  "], "--api-key"),
    ("media-dir-missing", ["serve", "--allowed-local-media-path", "/no/such/dir"], "not a directory"),
    ("max-images-zero", ["serve", "--max-images", "0"], "positive"),
    ("model-dir-missing", ["serve", "--model", "/no/such/model"], "neither a directory"),
    ("chat-model-dir-missing", ["chat", "--model", "/no/such/model"], "neither a directory"),
    ("model-dir-without-config", ["serve", "--model", "{empty_dir}"], "config.json"),
    ("max-model-len-zero", ["serve", "--model", "{model}", "--max-model-len", "0"], "max_model_len"),
    ("num-blocks-zero", ["chat", "--model", "{model}", "--num-blocks", "0"], "num_blocks"),
    ("chat-temperature-negative", ["chat", "--model", "{model}", "--temperature", "-1"], "temperature"),
    ("chat-top-p-zero", ["chat", "--model", "{model}", "--top-p", "0"], "top_p"),
    ("chat-max-tokens-zero", ["chat", "--model", "{model}", "--max-tokens", "0"], "max_tokens"),
]


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_options_exit_2_with_one_line(capsys, tmp_path, text_model_dir, argv, needle):
    argv = [a.format(empty_dir=tmp_path, model=text_model_dir) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and needle in err, err
    assert err.startswith(f"vlchat {argv[0]}: "), err
