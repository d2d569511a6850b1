"""One chat turn against the engine: messages in the engine's form, sampling parameters, a stream that aborts.

The API, the browser UI and the terminal chat all reach the engine through these functions, so a
request that is cancelled (Stop, a client that went away, Ctrl-C) is aborted in the engine the
same way everywhere.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import replace

from PIL import Image

from llm import SamplingParams
from llm.errors import PromptTooLongError

log = logging.getLogger("vlchat.generation")


def engine_message(role: str, texts: Sequence[str], images: Sequence[Image.Image] = ()) -> dict:
    """An OpenAI-style message the engine accepts: images first as {"type": "image"} parts, then the text."""
    text = "\n".join(t for t in texts if t)
    if not images:
        return {"role": role, "content": text}
    parts: list[dict] = [{"type": "image", "image": image} for image in images]
    if text:
        parts.append({"type": "text", "text": text})
    return {"role": role, "content": parts}


def count_images(messages: Sequence[dict]) -> int:
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image"
    )


def sampling_params(defaults: dict | None = None, **fields) -> SamplingParams:
    """SamplingParams from the fields that were given (None: the server's default, else the engine's).

    An unset max_tokens means "up to the context length", as in the OpenAI API.
    """
    given = {"max_tokens": None, **(defaults or {})}
    given.update((name, value) for name, value in fields.items() if value is not None)
    return SamplingParams(**given)


def new_request_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def stream_outputs(engine, request_id: str, prompt, params: SamplingParams) -> AsyncIterator:
    """Yield the engine's RequestOutputs; abort the request when the consumer stops before it finished."""
    finished = False
    try:
        async for output in engine.generate(request_id, prompt, params):
            finished = output.finished
            yield output
    finally:
        if not finished:
            try:
                await engine.abort(request_id)
            except Exception:  # the request may already be gone; nothing is left to free then
                log.debug("abort of %s failed", request_id, exc_info=True)


async def fitted_outputs(engine, request_id: str, prompt, params: SamplingParams) -> AsyncIterator:
    """Like `stream_outputs`, but when prompt + max_tokens overflow the context, generate what still fits."""
    try:
        async with aclosing(stream_outputs(engine, request_id, prompt, params)) as outputs:
            async for output in outputs:
                yield output
        return
    except PromptTooLongError as exc:
        room = exc.max_model_len - exc.prompt_len
        if exc.max_tokens is None or room < 1 or params.max_tokens is None or room >= params.max_tokens:
            raise
    async with aclosing(stream_outputs(engine, request_id + "-fit", prompt, replace(params, max_tokens=room))) as out:
        async for output in out:
            yield output
