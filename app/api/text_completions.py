"""POST /v1/completions: a prompt (text or token ids, or a batch of them) -> text_completion JSON or SSE stream.

Each prompt is one engine request of n completions; choice index = prompt index * n + completion index. `echo`
puts the prompt's text before each completion's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from vlchat.app.api.errors import error_body
from vlchat.app.api.logprobs import TokenTexts, completion_logprobs
from vlchat.app.api.protocol import CompletionRequest, StreamOptions
from vlchat.app.api.sampling import build_params, structured_output
from vlchat.app.errors import AppError, ModelNotFoundError, is_user_error, user_error_status
from vlchat.app.generation import new_request_id, stream_outputs
from vlchat.app.settings import ServerConfig

log = logging.getLogger("vlchat.api")
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}
MAX_PROMPTS = 32  # prompts per request at most (each is an engine request)


@dataclass(slots=True)
class PreparedCompletion:
    request_id: str
    model: str
    prompts: list[str | list[int]]
    params: object  # llm.SamplingParams
    echo: bool
    include_usage: bool
    logprobs: int | None
    texts: TokenTexts


def prepare_completion(body: CompletionRequest, config: ServerConfig, engine, model_name: str) -> PreparedCompletion:
    if body.model not in (None, "", model_name):
        raise ModelNotFoundError(f"model {body.model!r} is not served here; GET /v1/models lists {model_name!r}")
    prompts = body.prompts
    if len(prompts) > MAX_PROMPTS:
        raise AppError(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    if body.n > config.max_n:
        raise AppError(f"n must be between 1 and {config.max_n}", param="n")
    if len(body.stop_list) > config.max_stop_strings:
        raise AppError(f"at most {config.max_stop_strings} stop strings are allowed", param="stop")
    if body.echo and body.logprobs is not None:
        raise AppError("echo with logprobs would need the prompt's logprobs, which this server does not compute; "
                       "send one of them", param="echo")  # fmt: skip
    max_len = getattr(engine, "max_model_len", None)
    if body.max_tokens is not None and max_len and body.max_tokens >= max_len:
        raise AppError(f"max_tokens={body.max_tokens} does not fit the model's context of {max_len} tokens",
                       param="max_tokens", code="context_length_exceeded")  # fmt: skip
    constraint = structured_output(body, body.response_format)
    params = build_params(config, body, max_tokens=body.max_tokens, logprobs=body.logprobs, constraint=constraint)
    stream_options = body.stream_options or StreamOptions()
    return PreparedCompletion(new_request_id("cmpl"), model_name, prompts, params, body.echo,
                              stream_options.include_usage, body.logprobs, TokenTexts(engine.tokenizer))  # fmt: skip


def _usage(outputs: list) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs if o is not None)
    completion = sum(len(c.token_ids) for o in outputs if o is not None for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _prompt_text(req: PreparedCompletion, output) -> str:
    if output.prompt is not None:
        return output.prompt
    return req.texts.tokenizer.decode(output.prompt_token_ids, skip_special_tokens=True)


async def complete_text(engine, req: PreparedCompletion) -> dict:
    async def one(i: int, prompt):
        last = None
        rid = f"{req.request_id}-{i}"
        async with aclosing(stream_outputs(engine, rid, prompt, req.params, stream=False)) as outputs:
            async for output in outputs:
                last = output
        return last

    finals = await asyncio.gather(*(one(i, p) for i, p in enumerate(req.prompts)))
    n, choices = req.params.n, []
    for i, out in enumerate(finals):
        head = _prompt_text(req, out) if req.echo else ""
        for c in sorted(out.outputs, key=lambda c: c.index):
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(req.texts, c.token_ids, c.logprobs or [], req.logprobs)
            choices.append({"index": i * n + c.index, "text": head + c.text, "logprobs": logprobs,
                            "finish_reason": FINISH_REASONS.get(c.finish_reason, c.finish_reason)})  # fmt: skip
    return {"id": req.request_id, "object": "text_completion", "created": int(time.time()), "model": req.model,
            "choices": choices, "usage": _usage(finals)}  # fmt: skip


async def open_text_stream(engine, req: PreparedCompletion) -> AsyncIterator[str]:
    """Start every prompt's request now (a too-long prompt is still a 4xx) and return the SSE lines."""
    streams = [stream_outputs(engine, f"{req.request_id}-{i}", p, req.params) for i, p in enumerate(req.prompts)]
    firsts = []
    try:
        for s in streams:
            try:
                firsts.append(await s.__anext__())
            except StopAsyncIteration:
                firsts.append(None)
    except BaseException:
        for s in streams:
            await s.aclose()
        raise
    return _sse(req, streams, firsts)


async def _sse(req: PreparedCompletion, streams, firsts) -> AsyncIterator[str]:
    created, n = int(time.time()), req.params.n
    finals: list = list(firsts)
    sent_tokens: dict[int, int] = {}

    def lines(i: int, output) -> list[str]:
        out = []
        for c in output.outputs:
            index = i * n + c.index
            text = c.delta_text
            if req.echo and index not in sent_tokens:
                text = _prompt_text(req, output) + text
            logprobs = None
            if req.logprobs is not None:
                start = sent_tokens.get(index, 0)
                offset = len(c.text) - len(c.delta_text)
                logprobs = completion_logprobs(req.texts, c.token_ids[start:], (c.logprobs or [])[start:],
                                               req.logprobs, offset)  # fmt: skip
            sent_tokens[index] = len(c.token_ids)
            if text or c.finish_reason is not None or (logprobs and logprobs["tokens"]):
                reason = FINISH_REASONS.get(c.finish_reason, c.finish_reason) if c.finish_reason else None
                choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
                body = {"id": req.request_id, "object": "text_completion", "created": created, "model": req.model,
                        "choices": [choice]}  # fmt: skip
                out.append(f"data: {json.dumps(body, ensure_ascii=False)}\n\n")
        return out

    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
        try:
            async with aclosing(stream):
                async for output in stream:
                    await queue.put((i, output))
        except Exception as exc:  # noqa: BLE001 - reported in-band below
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    for i, first in enumerate(firsts):
        if first is not None:
            for line in lines(i, first):
                yield line
    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                log.warning("stream %s failed: %s", req.request_id, item, exc_info=not is_user_error(item))
                message = str(item) if is_user_error(item) else "internal server error; the server log has the details"
                status = user_error_status(item) if is_user_error(item) else 500
                yield f"data: {json.dumps(error_body(message, status))}\n\n"
            else:
                finals[i] = item
                for line in lines(i, item):
                    yield line
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if req.include_usage:
        body = {"id": req.request_id, "object": "text_completion", "created": created, "model": req.model,
                "choices": [], "usage": _usage(finals)}  # fmt: skip
        yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"
