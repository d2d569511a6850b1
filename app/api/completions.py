"""POST /v1/chat/completions: request -> engine prompt and sampling params -> JSON body or SSE stream."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from vlchat.app.api.errors import error_body
from vlchat.app.api.protocol import ChatCompletionRequest, ImagePart, StreamOptions
from vlchat.app.errors import AppError, ModelNotFoundError, is_user_error, user_error_status
from vlchat.app.generation import engine_message, mm_options, new_request_id, sampling_params, stream_outputs
from vlchat.app.media import load_images
from vlchat.app.settings import ServerConfig

log = logging.getLogger("vlchat.api")
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


@dataclass(slots=True)
class PreparedRequest:
    request_id: str
    model: str
    prompt: list[dict]
    params: object  # llm.SamplingParams
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats
    mm: dict | None = None  # the engine's per-request image options


async def prepare(body: ChatCompletionRequest, config: ServerConfig, engine, model_name: str) -> PreparedRequest:
    """Validate what the schema cannot, and decode the images (off the event loop)."""
    if body.model not in (None, "", model_name):
        raise ModelNotFoundError(f"model {body.model!r} is not served here; GET /v1/models lists {model_name!r}")
    if body.n > config.max_n:
        raise AppError(f"n must be between 1 and {config.max_n}", param="n")
    if len(body.stop_list) > config.max_stop_strings:
        raise AppError(f"at most {config.max_stop_strings} stop strings are allowed", param="stop")
    max_len = getattr(engine, "max_model_len", None)
    if body.max_new_tokens is not None and max_len and body.max_new_tokens >= max_len:
        raise AppError(
            f"max_tokens={body.max_new_tokens} does not fit the model's context of {max_len} tokens; ask for fewer",
            param="max_tokens",
            code="context_length_exceeded",
        )
    sources = [part.image_url.url for m in body.messages if isinstance(m.content, list) for part in m.content
               if isinstance(part, ImagePart)]  # fmt: skip
    if len(sources) > config.media.max_images_per_request:
        raise AppError(
            f"{len(sources)} images sent; at most {config.media.max_images_per_request} per request", param="messages"
        )
    images = await asyncio.to_thread(load_images, sources, config.media)  # headers and pixel budget first
    prompt, next_image = [], iter(images)
    for message in body.messages:
        role = "system" if message.role == "developer" else message.role
        if isinstance(message.content, list):
            parts = [next(next_image) if isinstance(p, ImagePart) else p.text for p in message.content]
            prompt.append(engine_message(role, parts))
        else:
            prompt.append(engine_message(role, [message.content or ""]))
    params = sampling_params(
        config.sampling_defaults,
        n=body.n,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        max_tokens=body.max_new_tokens,
        stop=body.stop_list or None,
        ignore_eos=body.ignore_eos or None,
    )
    options = body.stream_options or StreamOptions()
    mm = mm_options(config.media, processor_kwargs(body, config))
    return PreparedRequest(
        new_request_id(), model_name, prompt, params, options.include_usage, options.continuous_usage_stats, mm
    )


def processor_kwargs(body: ChatCompletionRequest, config: ServerConfig) -> dict:
    """`mm_processor_kwargs` within the server's limit: an image may not be sized above max_processor_pixels."""
    if body.mm_processor_kwargs is None:
        return {}
    given = body.mm_processor_kwargs.model_dump(exclude_none=True)
    limit = config.media.max_processor_pixels
    for name, value in given.items():
        if value > limit:
            raise AppError(f"mm_processor_kwargs.{name}={value} is over this server's limit of {limit} pixels",
                           param=f"mm_processor_kwargs.{name}")  # fmt: skip
    return given


def usage(output, completions=None) -> dict:
    """The usage of `output`: its prompt and the tokens of `completions` (default: all its choices)."""
    prompt_tokens = len(output.prompt_token_ids)
    completion_tokens = sum(len(c.token_ids) for c in (output.outputs if completions is None else completions))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def complete(engine, req: PreparedRequest) -> dict:
    """Run to the end and answer with one chat.completion object."""
    last = None
    async with aclosing(
        stream_outputs(engine, req.request_id, req.prompt, req.params, stream=False, mm=req.mm)
    ) as outputs:
        async for output in outputs:
            last = output
    choices = [
        {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": None,
            "finish_reason": FINISH_REASONS.get(c.finish_reason, c.finish_reason),
        }
        for c in sorted(last.outputs, key=lambda c: c.index)
    ]
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": usage(last),
    }


async def open_stream(engine, req: PreparedRequest) -> AsyncIterator[str]:
    """Start generating now (so errors such as a too-long prompt are still 4xx) and return the SSE lines."""
    outputs = stream_outputs(engine, req.request_id, req.prompt, req.params, mm=req.mm)
    try:
        first = await outputs.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        await outputs.aclose()
        raise
    return _sse(req, first, outputs)


async def _sse(req: PreparedRequest, first, outputs) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choices: list[dict], **extra) -> str:
        body = {"id": req.request_id, "object": "chat.completion.chunk", "created": created, "model": req.model}
        body["choices"] = choices
        body.update(extra)
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    n = req.params.n
    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None} for i in range(n)])
    last, reported = first, set()
    try:
        async with aclosing(outputs):
            for line in _lines(first, reported, chunk, req.continuous_usage):
                yield line
            async for last in outputs:
                for line in _lines(last, reported, chunk, req.continuous_usage):
                    yield line
    except Exception as exc:  # the response has started: report in-band, as OpenAI does
        log.warning("stream %s failed: %s", req.request_id, exc, exc_info=not is_user_error(exc))
        message = str(exc) if is_user_error(exc) else "internal server error; the server log has the details"
        yield f"data: {json.dumps(error_body(message, user_error_status(exc) if is_user_error(exc) else 500))}\n\n"
    if req.include_usage and last is not None:
        yield chunk([], usage=usage(last))
    yield "data: [DONE]\n\n"


def _lines(output, reported: set, chunk, continuous_usage: bool = False) -> list[str]:
    """The SSE chunks one RequestOutput adds: new text, then the finish reason of completions that ended; with
    `continuous_usage`, each with its choice's usage so far: the prompt and that choice's tokens (one output may
    carry several tokens: a client that fell behind gets the outputs it missed merged,
    llm.engine.async_engine.merge_outputs)."""
    lines = []
    for c in output.outputs if output is not None else ():
        if c.index in reported:
            continue
        extra = {"usage": usage(output, [c])} if continuous_usage else {}
        if c.delta_text:
            delta = {"index": c.index, "delta": {"content": c.delta_text}, "finish_reason": None}
            lines.append(chunk([delta], **extra))
        if c.finish_reason is not None:
            reported.add(c.index)
            reason = FINISH_REASONS.get(c.finish_reason, c.finish_reason)
            lines.append(chunk([{"index": c.index, "delta": {}, "finish_reason": reason}], **extra))
    return lines
