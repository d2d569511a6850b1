"""The browser UI: a chat with edit, retry, undo and Stop, saved chats in a sidebar, and the `/chat` API endpoint.

A turn the app or the engine refuses (an unreadable image, a prompt over the context) never enters
the conversation: the chat goes back to what it was and the user's input goes back into the box,
with a warning toast saying what is wrong. Stop cancels the turn's generator, whose `finally`
aborts the engine request. The conversation forms and their conversions are in app/ui_history.py,
the saved chats in app/ui_chats.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing

import gradio as gr

from vlchat.app import ui_chats
from vlchat.app.errors import is_user_error
from vlchat.app.generation import fitted_outputs, mm_options, new_request_id, sampling_params
from vlchat.app.model_choice import ModelChoice
from vlchat.app.settings import MediaLimits, ServerConfig
from vlchat.app.ui_history import (
    CUT_NOTE,
    assistant,
    engine_messages,
    last_turn_start,
    openai_to_engine,
    turn_input,
    turn_start,
    user_turn,
)  # fmt: skip
from vlchat.app.ui_jobs import ResultReaders, current_job

log = logging.getLogger("vlchat.ui")

DEFAULT_SYSTEM_PROMPT = ""
UI_UPDATE_INTERVAL_S = 0.05
UPLOAD_CLEANUP = (600, 3600)  # every 10 minutes, delete uploads older than an hour (and all of them at exit)
EXAMPLE_PROMPTS = ("Describe the image.", "What shapes are in the image?", "How many shapes are there?")
# The browser encrypts the saved chats with this key; it only has to stay the same across server restarts.
STORE_SECRET = "vlchat-saved-chats"
# Images in the chat as thumbnails (one message per image would otherwise fill the screen); a click enlarges.
CSS = "#chatbot .message.user img { max-height: 160px; width: auto; object-fit: contain; }"


def conversation(message: dict, history: list[dict], system_prompt: str, limits: MediaLimits) -> list[dict]:
    """Chatbot history + the new textbox value -> engine messages (images from the server's own uploads)."""
    return engine_messages([*history, *user_turn(message.get("text") or "", message.get("files") or [])],
                           system_prompt, limits)  # fmt: skip


def make_respond(engine, config: ServerConfig, readers: ResultReaders | None = None):
    """The `/chat` API function: one conversation per call; `history` (OpenAI messages) carries earlier turns.

    With `readers`, a call run by Gradio's queue stops (and aborts its engine request) once nobody reads its results.
    """

    async def respond(message, history, system_prompt, temperature, top_p, max_new_tokens):
        try:
            message = message if isinstance(message, dict) else {"text": str(message or ""), "files": []}
            new = user_turn(message.get("text") or "", message.get("files") or [])
            earlier = await asyncio.to_thread(openai_to_engine, history or [], config.media)
            turn = await asyncio.to_thread(engine_messages, new, "", config.media)
            system = [{"role": "system", "content": system_prompt.strip()}] if (system_prompt or "").strip() else []
            prompt = system + earlier + turn
            params = sampling_params(config.sampling_defaults, temperature=float(temperature), top_p=float(top_p),
                                     max_tokens=int(max_new_tokens))  # fmt: skip
        except Exception as exc:
            _warn(exc)
            return
        text, shown, last_shown = "", "", 0.0
        try:
            async with aclosing(_outputs(engine, config, prompt, params, readers)) as outputs:
                async for output in outputs:
                    text = output.outputs[0].text
                    if time.monotonic() - last_shown >= UI_UPDATE_INTERVAL_S:  # not a browser redraw per token
                        shown, last_shown = text, time.monotonic()
                        yield text
        except Exception as exc:
            _warn(exc)
        if text != shown:
            yield text

    return respond


def _outputs(engine, config: ServerConfig, prompt, params, readers: ResultReaders | None):
    outputs = fitted_outputs(engine, new_request_id("ui"), prompt, params, mm_options(config.media))
    return outputs if readers is None else readers.while_read(outputs, current_job())


def _warn(exc: BaseException) -> None:
    if is_user_error(exc):
        gr.Warning(str(exc))
    else:
        log.exception("chat turn failed")
        gr.Warning(f"Generation failed ({type(exc).__name__}); the server log has the details.")


def _textbox(**changes) -> dict:
    return gr.update(**changes)


BUSY = dict(interactive=False, submit_btn=False, stop_btn=True)
IDLE = dict(interactive=True, submit_btn=True, stop_btn=False)


def make_turns(engine, config: ServerConfig, readers: ResultReaders | None = None):
    """The UI's event handlers that run a turn; each yields (textbox update, chatbot value)."""

    async def run(prior, turn, before, restore, settings):
        """Answer `turn` after `prior`; on refusal show `before` again and put `restore` back in the textbox."""
        history = [*prior, *turn]
        refused = (_textbox(value=restore, **IDLE) if restore is not None else _textbox(**IDLE)), before
        system, temperature, top_p, max_new = settings
        try:
            prompt = await asyncio.to_thread(engine_messages, history, system or "", config.media)
            params = sampling_params(config.sampling_defaults, temperature=float(temperature), top_p=float(top_p),
                                     max_tokens=int(max_new))  # fmt: skip
        except Exception as exc:
            _warn(exc)
            yield refused
            return
        yield _textbox(value=None, **BUSY), history
        text, finish, last_shown = "", None, 0.0
        try:
            async with aclosing(_outputs(engine, config, prompt, params, readers)) as outputs:
                async for output in outputs:
                    text, finish = output.outputs[0].text, output.outputs[0].finish_reason
                    if time.monotonic() - last_shown >= UI_UPDATE_INTERVAL_S:
                        last_shown = time.monotonic()
                        yield gr.skip(), [*history, assistant(text)]
        except Exception as exc:
            _warn(exc)
            if not text:  # refused before answering: the turn does not enter the conversation
                yield refused
                return
        yield gr.skip(), [*history, assistant(text + (CUT_NOTE if finish == "length" else ""))]

    async def send(message, history, *settings):
        message = message or {}
        turn = user_turn(message.get("text") or "", message.get("files") or [])
        async for update in run(history, turn, history, message, settings):
            yield update

    async def edit(history, system, temperature, top_p, max_new, edit_data: gr.EditData):
        settings = (system, temperature, top_p, max_new)
        index = edit_data.index[0] if isinstance(edit_data.index, (list, tuple)) else edit_data.index
        before = [*history[:index], *user_turn(str(edit_data.previous_value or ""), []), *history[index + 1 :]]
        start = turn_start(history, index)
        turn = [*history[start:index], *user_turn(str(edit_data.value or ""), [])]
        async for update in run(history[:start], turn, before, {"text": str(edit_data.value or ""), "files": []},
                                settings):  # fmt: skip
            yield update

    async def retry(history, *settings):
        start = last_turn_start(history)
        if start is None:
            yield gr.skip(), history
            return
        turn = [m for m in history[start:] if m.get("role") == "user"]
        async for update in run(history[:start], turn, history, None, settings):
            yield update

    async def example(history, system, temperature, top_p, max_new, selected: gr.SelectData):
        settings = (system, temperature, top_p, max_new)
        value = selected.value or {}
        turn = user_turn(value.get("text") or "", value.get("files") or [])
        async for update in run([], turn, history, None, settings):
            yield update

    return send, edit, retry, example


def undo(history):
    start = last_turn_start(history)
    if start is None:
        return gr.skip(), history
    users = [m for m in history[start:] if m.get("role") == "user"]
    return _textbox(value=turn_input(users), **IDLE), history[:start]


def header(model: ModelChoice) -> str:
    text = f"## vlchat\nModel: **{model.name}**"
    if model.untrained:
        text += " &nbsp; ⚠️ *untrained demo weights: the answers are random text*"
    return text


def build_ui(engine, model: ModelChoice, config: ServerConfig, readers: ResultReaders | None = None) -> gr.Blocks:
    from vlchat.app.ui_sidebar import wire_sidebar

    max_len = getattr(engine, "max_model_len", None) or 2048
    blocks = dict(title=f"vlchat - {model.name}", analytics_enabled=config.analytics_enabled, fill_height=True)
    images = model.example_images()
    examples = [{"text": EXAMPLE_PROMPTS[i % 3], "files": [str(p)]} for i, p in enumerate(images[:4])]
    with gr.Blocks(**blocks, delete_cache=UPLOAD_CLEANUP) as ui:
        store = gr.BrowserState(ui_chats.empty(), storage_key=ui_chats.STORAGE_KEY, secret=STORE_SECRET)
        chat_id = gr.State(None)
        with gr.Sidebar(label="Chats", elem_id="sidebar"):
            sidebar = dict(
                new=gr.Button("New chat", variant="primary", elem_id="new-chat"),
                chats=gr.Radio(choices=[], label="Saved chats", elem_id="chat-list"),
                title=gr.Textbox(label="Rename the open chat", placeholder="new name, then Enter", elem_id="rename"),
                delete=gr.Button("Delete the open chat", variant="stop", size="sm", elem_id="delete-chat"),
                export=gr.DownloadButton("Export JSON", size="sm", elem_id="export-chat", interactive=False),
                load=gr.UploadButton("Import JSON", file_types=[".json"], size="sm", elem_id="import-chat"),
            )
        gr.Markdown(header(model), elem_id="model-name")
        chatbot = gr.Chatbot(
            label=model.name, elem_id="chatbot", scale=1, buttons=["copy", "copy_all"], editable="user",
            group_consecutive_messages=False, examples=examples or None,
            placeholder="Attach one or more images and ask about them, or just say hello.",
        )  # fmt: skip
        textbox = gr.MultimodalTextbox(
            file_types=["image"], file_count="multiple", sources=["upload"], submit_btn=True, stop_btn=False,
            show_label=False, placeholder="Ask about an image: attach, drop or paste one or more", elem_id="prompt",
        )  # fmt: skip
        with gr.Accordion("Generation settings", open=False, elem_id="settings"):
            system = gr.Textbox(DEFAULT_SYSTEM_PROMPT, label="System prompt", lines=2)
            temperature = gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="Top-p")
            max_new = gr.Slider(1, max(1, max_len - 1), value=min(512, max_len - 1), step=1, label="Max new tokens")
        settings = [system, temperature, top_p, max_new]

        send, edit, retry, example = make_turns(engine, config, readers)
        io = dict(outputs=[textbox, chatbot], concurrency_limit=config.ui_concurrency, api_visibility="private")
        turns = [
            textbox.submit(send, [textbox, chatbot, *settings], **io),
            chatbot.edit(edit, [chatbot, *settings], **io),
            chatbot.retry(retry, [chatbot, *settings], **io),
            chatbot.example_select(example, [chatbot, *settings], **io),
        ]
        undone = chatbot.undo(undo, [chatbot], [textbox, chatbot], api_visibility="private", queue=False)
        textbox.stop(None, None, None, cancels=turns, api_visibility="private")
        wire_sidebar(ui, sidebar, store, chat_id, chatbot, textbox, config.media, after=[*turns, undone])

        # The API: one conversation per call (`history` passes earlier turns), no state kept between calls.
        api_message = gr.MultimodalTextbox(visible=False, file_count="multiple")
        api_history = gr.JSON(value=[], visible=False)
        api_answer = gr.Textbox(visible=False)
        respond = make_respond(engine, config, readers)

        async def chat(message, system, temperature, top_p, max_new_tokens, history=None):
            # closed with this generator (Gradio closes it when its reader leaves), not whenever it is collected
            async with aclosing(respond(message, history, system, temperature, top_p, max_new_tokens)) as texts:
                async for text in texts:
                    yield text

        gr.Button(visible=False).click(
            chat, [api_message, *settings, api_history], [api_answer], api_name="chat",
            concurrency_limit=config.ui_concurrency,
        )
    ui.queue(max_size=config.ui_queue_size)  # beyond it Gradio answers 503 "queue is full"
    return ui
