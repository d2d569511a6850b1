"""`vlchat chat`: a terminal chat that streams answers; /image PATH attaches an image to the next message."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TextIO

from vlchat.app.errors import AppError, is_user_error
from vlchat.app.generation import engine_message, fitted_outputs, mm_options, new_request_id, sampling_params
from vlchat.app.media import load_image
from vlchat.app.settings import MediaLimits

CUT_NOTE = "[answer cut at the token limit; raise it with --max-tokens]"
HELP = "Commands: /image PATH (attach to the next message), /reset (forget the conversation), /exit."


@dataclass(slots=True)
class TerminalChat:
    """The conversation state and the command handling, apart from the terminal so it can be tested."""

    engine: object
    limits: MediaLimits
    sampling: dict = field(default_factory=dict)
    system_prompt: str | None = None
    messages: list[dict] = field(default_factory=list)
    pending_images: list = field(default_factory=list)
    finish_reason: str | None = None  # of the last answer: "length" when it stopped at max_tokens

    def command(self, line: str) -> str | None:
        """Handle a /command; returns what to print, or None for /exit."""
        name, _, arg = line.strip().partition(" ")
        if name in ("/exit", "/quit"):
            return None
        if name == "/reset":
            self.messages.clear()
            self.pending_images.clear()
            return "(conversation reset)"
        if name == "/image":
            path = os.path.expanduser(arg.strip().strip("'\""))
            if not path:
                return "usage: /image PATH"
            if self.num_images() >= self.limits.max_images_per_request:
                raise AppError(f"at most {self.limits.max_images_per_request} images per conversation; /reset first")
            self.pending_images.append(load_image(os.path.abspath(path), self.limits, trusted_path=True))
            return f"(image {len(self.pending_images)} attached to your next message: {path})"
        return f"unknown command {name}. {HELP}"

    def num_images(self) -> int:
        parts = [p for m in self.messages if isinstance(m["content"], list) for p in m["content"]]
        return sum(p["type"] == "image" for p in parts) + len(self.pending_images)

    async def answer(self, text: str, write: Callable[[str], None]) -> str:
        """Send `text` (with the attached images), stream the answer through `write`, and remember the turn."""
        turn = engine_message("user", [*self.pending_images, text])
        prompt = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + self.messages
        params = sampling_params(**self.sampling)
        answer, self.finish_reason = "", None
        outputs = fitted_outputs(self.engine, new_request_id("term"), prompt + [turn], params, mm_options(self.limits))
        async with aclosing(outputs):
            async for output in outputs:
                delta = output.outputs[0].text[len(answer) :]
                answer, self.finish_reason = output.outputs[0].text, output.outputs[0].finish_reason
                if delta:
                    write(delta)
        self.messages += [turn, {"role": "assistant", "content": answer}]
        self.pending_images = []
        return answer


def _line_reader(stdin: TextIO) -> asyncio.Queue:
    """Lines of `stdin` from a daemon thread (a blocked read must not keep the process alive); "" at the end."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    if hasattr(stdin, "reconfigure"):  # bytes that are not UTF-8 become U+FFFD instead of killing the reader
        stdin.reconfigure(errors="replace")

    def read() -> None:
        while True:
            try:
                line = stdin.readline()
            except (OSError, ValueError):  # closed or unreadable input ends the chat like end of input
                line = ""
            loop.call_soon_threadsafe(queue.put_nowait, line)
            if not line:
                return

    threading.Thread(target=read, name="vlchat-stdin", daemon=True).start()
    return queue


async def run_chat(chat: TerminalChat, model_label: str, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """The read-answer loop. Ctrl-C during an answer stops it (the engine request is aborted); at the prompt: exit."""

    def write(text: str) -> None:
        stdout.write(text)
        stdout.flush()

    write(f"vlchat: chatting with {model_label}.\n{HELP}\n")
    lines = _line_reader(stdin)
    while True:
        write("> ")
        try:
            line = await lines.get()
        except asyncio.CancelledError:
            write("\n")
            return 130
        if not line:  # end of input
            write("\n")
            return 0
        line = line.strip()
        if not line:
            continue
        try:
            if line.startswith("/"):
                reply = chat.command(line)
                if reply is None:
                    return 0
                write(reply + "\n")
                continue
            task = asyncio.ensure_future(chat.answer(line, write))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us; stop the answer and go on
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                getattr(asyncio.current_task(), "uncancel", lambda: 0)()
                write("\n(stopped; a second Ctrl-C exits)")
            if task.done() and not task.cancelled() and chat.finish_reason == "length":
                write(f"\n{CUT_NOTE}")
            write("\n")
        except Exception as exc:
            if not is_user_error(exc):
                raise
            write(f"error: {exc}\n")


def chat_main(model: str | None, engine_options: dict, sampling: dict, system_prompt: str | None) -> int:
    from vlchat.app.model_choice import resolve_model, start_engine

    choice = resolve_model(model)

    async def main() -> int:
        engine = start_engine(choice, engine_options)
        chat = TerminalChat(engine, MediaLimits(), sampling=sampling, system_prompt=system_prompt)
        return await run_chat(chat, choice.describe())

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
