"""The browser UI (Gradio Blocks around a multimodal ChatInterface), streaming from the engine.

Retry, undo, edit, clear and Stop come from ChatInterface; Stop cancels the generator below,
whose `finally` aborts the engine request. User errors become `gr.Warning` toasts, never tracebacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path

import gradio as gr

from vlchat.app.errors import AppError, is_user_error
from vlchat.app.generation import engine_message, fitted_outputs, new_request_id, sampling_params
from vlchat.app.media import load_images
from vlchat.app.model_choice import ModelChoice
from vlchat.app.settings import MediaLimits, ServerConfig

log = logging.getLogger("vlchat.ui")

DEFAULT_SYSTEM_PROMPT = ""
UI_UPDATE_INTERVAL_S = 0.05
UPLOAD_CLEANUP = (600, 3600)  # every 10 minutes, delete uploads older than an hour (and all of them at exit)
EXAMPLE_PROMPTS = ("Describe the image.", "What shapes are in the image?", "How many shapes are there?")


def file_path(item) -> str | None:
    """The local path of a Gradio file value (a str, a FileData dict or object)."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        inner = item.get("file", item)
        return inner.get("path") if isinstance(inner, dict) else getattr(inner, "path", None)
    return getattr(item, "path", None)


def conversation(message: dict, history: Sequence[dict], system_prompt: str, limits: MediaLimits) -> list[dict]:
    """Gradio history + the new multimodal message -> engine messages (consecutive same-role turns merged)."""
    turns: list[tuple[str, list]] = []  # (role, parts: text or image paths, in order)

    def add(role: str, parts: list) -> None:
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(parts)
        else:
            turns.append((role, parts))

    for entry in history:
        role, content = entry.get("role"), entry.get("content")
        if role not in ("user", "assistant"):
            continue
        parts = []
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(part.get("text", ""))
            elif role == "user" and (path := file_path(part)):
                parts.append(Path(path))
        add(role, parts)
    new_files = [Path(p) for p in map(file_path, message.get("files") or []) if p]
    text = message.get("text") or ""
    if not text.strip() and not new_files:
        raise AppError("type a message or attach an image first")
    add("user", [*new_files, text])
    total = sum(isinstance(p, Path) for _, parts in turns for p in parts)
    if total > limits.max_images_per_request:
        raise AppError(
            f"this conversation has {total} images; at most {limits.max_images_per_request} fit one request. "
            "Press Clear to start a new chat."
        )
    messages = [{"role": "system", "content": system_prompt.strip()}] if system_prompt.strip() else []
    paths = [p for _, parts in turns for p in parts if isinstance(p, Path)]
    images = iter(load_images(paths, limits, trusted_path=True))  # one request: its pixel budget covers them all
    for role, parts in turns:
        messages.append(engine_message(role, [next(images) if isinstance(p, Path) else p for p in parts]))
    return messages


def make_respond(engine, config: ServerConfig):
    async def respond(message, history, system_prompt, temperature, top_p, max_new_tokens):
        try:
            prompt = await asyncio.to_thread(conversation, message, history, system_prompt or "", config.media)
            sampling = {"temperature": float(temperature), "top_p": float(top_p), "max_tokens": int(max_new_tokens)}
            params = sampling_params(config.sampling_defaults, **sampling)
        except Exception as exc:
            _warn(exc)
            return
        text, shown, last_shown = "", "", 0.0
        try:
            async with aclosing(fitted_outputs(engine, new_request_id("ui"), prompt, params)) as outputs:
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


def _warn(exc: BaseException) -> None:
    if is_user_error(exc):
        gr.Warning(str(exc))
    else:
        log.exception("chat turn failed")
        gr.Warning(f"Generation failed ({type(exc).__name__}); the server log has the details.")


def header(model: ModelChoice) -> str:
    text = f"## vlchat\nModel: **{model.name}**"
    if model.untrained:
        text += " &nbsp; ⚠️ *untrained demo weights: the answers are random text*"
    return text


def build_ui(engine, model: ModelChoice, config: ServerConfig) -> gr.Blocks:
    max_len = getattr(engine, "max_model_len", None) or 2048
    blocks = dict(title=f"vlchat - {model.name}", analytics_enabled=config.analytics_enabled, fill_height=True)
    with gr.Blocks(**blocks, delete_cache=UPLOAD_CLEANUP) as ui:
        gr.Markdown(header(model), elem_id="model-name")
        with gr.Accordion("Generation settings", open=False, render=False, elem_id="settings") as settings:
            system = gr.Textbox(DEFAULT_SYSTEM_PROMPT, label="System prompt", lines=2, render=False)
            temperature = gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="Temperature", render=False)
            top_p = gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="Top-p", render=False)
            max_new = gr.Slider(1, max(1, max_len - 1), value=min(512, max_len - 1), step=1,
                                label="Max new tokens", render=False)  # fmt: skip
        images = model.example_images()
        examples = [[{"text": EXAMPLE_PROMPTS[i % 3], "files": [str(p)]}] for i, p in enumerate(images[:4])]
        gr.ChatInterface(
            make_respond(engine, config),
            multimodal=True,
            chatbot=gr.Chatbot(label=model.name, elem_id="chatbot", scale=1, buttons=["copy"]),
            textbox=gr.MultimodalTextbox(
                file_types=["image"],
                file_count="multiple",
                placeholder="Ask about an image: attach, drop or paste one or more",
                sources=["upload"],
                submit_btn=True,
                stop_btn=True,
                elem_id="prompt",
            ),
            additional_inputs=[system, temperature, top_p, max_new],
            additional_inputs_accordion=settings,
            examples=examples or None,
            cache_examples=False,
            editable=True,
            concurrency_limit=config.ui_concurrency,  # the engine batches these; more wait in the queue
            api_name="chat",
        )
    ui.queue(max_size=config.ui_queue_size)  # beyond it Gradio answers 503 "queue is full"
    return ui
