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

from vlchat.llm import SamplingParams
from vlchat.llm.errors import PromptTooLongError

log = logging.getLogger("vlchat.generation")


def engine_message(role: str, parts: Sequence[str | Image.Image]) -> dict:
    """An OpenAI-style message the engine accepts, keeping the order of text and {"type": "image"} parts.

    Without images the content is one string (what every chat template understands).
    """
    if not any(isinstance(p, Image.Image) for p in parts):
        return {"role": role, "content": "\n".join(p for p in parts if p)}
    content = [{"type": "image", "image": p} if isinstance(p, Image.Image) else {"type": "text", "text": p}
               for p in parts if isinstance(p, Image.Image) or p]  # fmt: skip
    return {"role": role, "content": content}


def sampling_params(defaults: dict | None = None, **fields) -> SamplingParams:
    """SamplingParams from the fields that were given (None: the server's default, else the engine's).

    An unset max_tokens means "up to the context length", as in the OpenAI API.
    """
    given = {"max_tokens": None, **(defaults or {})}
    given.update((name, value) for name, value in fields.items() if value is not None)
    return SamplingParams(**given)


def new_request_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def mm_options(limits, processor_kwargs: dict | None = None) -> dict:
    """The engine's per-request image options: the server's image limit and the caller's pixel budget."""
    return {"max_images": limits.max_images_per_request, **(processor_kwargs or {})}


async def stream_outputs(
    engine, request_id: str, prompt, params: SamplingParams, stream: bool = True, mm: dict | None = None
) -> AsyncIterator:
    """Yield the engine's RequestOutputs (`stream=False`: the final one only); abort the request when the consumer
    stops before it finished. `mm`: the engine's per-request prompt options (`mm_options`; the API adds tools and
    chat_template)."""
    finished = False
    try:
        async for output in engine.generate(request_id, prompt, params, mm_options=mm, stream=stream):
            finished = output.finished
            yield output
    finally:
        if not finished:
            try:
                await engine.abort(request_id)
            except Exception:  # the request may already be gone; nothing is left to free then
                log.debug("abort of %s failed", request_id, exc_info=True)


async def fitted_outputs(
    engine, request_id: str, prompt, params: SamplingParams, mm: dict | None = None
) -> AsyncIterator:
    """Like `stream_outputs`, but when prompt + max_tokens overflow the context, generate what still fits."""
    try:
        async with aclosing(stream_outputs(engine, request_id, prompt, params, mm=mm)) as outputs:
            async for output in outputs:
                yield output
        return
    except PromptTooLongError as exc:
        room = exc.max_model_len - exc.prompt_len
        if exc.max_tokens is None or room < 1 or params.max_tokens is None or room >= params.max_tokens:
            raise
    fitted = replace(params, max_tokens=room)
    async with aclosing(stream_outputs(engine, request_id + "-fit", prompt, fitted, mm=mm)) as out:
        async for output in out:
            yield output
