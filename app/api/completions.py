"""POST /v1/chat/completions: request -> engine prompt and sampling params -> JSON body or SSE stream.

With tools (tool_choice other than "none") the answer is parsed for the model family's tool calls
(app/api/tools.py): they come back as `tool_calls` with finish_reason "tool_calls" (or "length" where max_tokens cut
the answer: the model did not finish it); streamed, content stops at a
call's marker (text that may still grow into one is held back) and each call follows as `tool_calls` deltas as soon
as its text is complete (Hermes style: its </tool_call>; the other families: the end of the answer)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from vlchat.app.api.errors import error_body
from vlchat.app.api.logprobs import TokenTexts, chat_logprobs
from vlchat.app.api.protocol import ChatCompletionRequest, ImagePart, StreamOptions
from vlchat.app.api.sampling import build_params, structured_output
from vlchat.app.api.tools import ToolFormat, forced_grammar, template_message, tool_format
from vlchat.app.errors import AppError, ModelNotFoundError, is_user_error, user_error_status
from vlchat.app.generation import engine_message, mm_options, new_request_id, stream_outputs
from vlchat.app.media import load_images
from vlchat.app.settings import ServerConfig
from vlchat.llm import StructuredOutputParams

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
    mm: dict | None = None  # the engine's prompt options: image limits, tools, chat_template
    tools: ToolFormat | None = None  # set: parse the answer for this family's tool calls
    parallel_tool_calls: bool = True
    top_logprobs: int | None = None  # set: answer with logprobs and this many alternatives per token
    texts: TokenTexts | None = None


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
            entry = engine_message(role, parts)
        else:
            entry = engine_message(role, [message.content or ""])
        for key in ("tool_calls", "tool_call_id", "name"):
            value = getattr(message, key)
            if value is not None:
                entry[key] = [c.model_dump() for c in value] if key == "tool_calls" else value
        prompt.append(template_message(entry))
    options = mm_options(config.media, processor_kwargs(body, config))
    if config.chat_template:
        options["chat_template"] = config.chat_template
    constraint = structured_output(body, body.response_format)
    fmt = None
    if body.tools and body.tool_choice != "none":
        template = config.chat_template or getattr(getattr(engine, "tokenizer", None), "chat_template", None)
        fmt = tool_format(template if isinstance(template, str) else None)
        if fmt is None:
            raise AppError("this model's chat template does not render tools; serve it with --chat-template FILE "
                           "naming a template that does (Hermes <tool_call>, Llama 3.1 or Mistral style)",
                           param="tools")  # fmt: skip
        options["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
        if constraint is not None:
            raise AppError("tools cannot be combined with response_format or structured_outputs; send one",
                           param="tools")  # fmt: skip
        if body.tool_choice == "required" or not isinstance(body.tool_choice, (str, type(None))):
            grammar = forced_grammar(fmt, body.tools, body.tool_choice, body.parallel_tool_calls,
                                     _special_ids(getattr(engine, "tokenizer", None)))  # fmt: skip
            constraint = StructuredOutputParams(grammar=grammar)
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = build_params(config, body, max_tokens=body.max_new_tokens, logprobs=top, constraint=constraint)
    stream_options = body.stream_options or StreamOptions()
    return PreparedRequest(
        new_request_id(), model_name, prompt, params, stream_options.include_usage,
        stream_options.continuous_usage_stats, options, fmt, body.parallel_tool_calls, top,
        TokenTexts(engine.tokenizer) if top is not None else None,
    )  # fmt: skip


def _special_ids(tokenizer) -> dict[str, int]:
    """Added special tokens by text (a grammar names them by id: their text is not what the tokenizer splits)."""
    try:
        return {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    except AttributeError:
        return {}


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
    outputs = stream_outputs(engine, req.request_id, req.prompt, req.params, stream=False, mm=req.mm)
    async with aclosing(outputs) as outputs:
        async for output in outputs:
            last = output
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [_choice(req, c) for c in sorted(last.outputs, key=lambda c: c.index)],
        "usage": usage(last),
    }


def _with_calls(reason: str) -> str:
    """The finish reason of an answer with tool calls: "tool_calls" where the model ended it, "length" where max_tokens
    or the context cut it (its last call may be cut short too; the ones before it come back all the same)."""
    return "tool_calls" if reason == "stop" else reason


def _choice(req: PreparedRequest, c) -> dict:
    message = {"role": "assistant", "content": c.text}
    reason = FINISH_REASONS.get(c.finish_reason, c.finish_reason)
    if req.tools is not None:
        content, calls = req.tools.parse(c.text)
        calls = calls if req.parallel_tool_calls else calls[:1]
        if calls:
            message = {"role": "assistant", "content": content,
                       "tool_calls": req.tools.openai_calls(calls)}  # fmt: skip
            reason = _with_calls(reason)
    logprobs = None
    if req.top_logprobs is not None:
        logprobs = chat_logprobs(req.texts, c.token_ids, c.logprobs or [], req.top_logprobs)
    return {"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": reason}


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
    last, state = first, _StreamState(req)
    try:
        async with aclosing(outputs):
            for line in state.lines(first, chunk):
                yield line
            async for last in outputs:
                for line in state.lines(last, chunk):
                    yield line
    except Exception as exc:  # the response has started: report in-band, as OpenAI does
        log.warning("stream %s failed: %s", req.request_id, exc, exc_info=not is_user_error(exc))
        message = str(exc) if is_user_error(exc) else "internal server error; the server log has the details"
        yield f"data: {json.dumps(error_body(message, user_error_status(exc) if is_user_error(exc) else 500))}\n\n"
    if req.include_usage and last is not None:
        yield chunk([], usage=usage(last))
    yield "data: [DONE]\n\n"


class _StreamState:
    """Per choice: what was sent (text, tokens, tool calls), so each output adds only its new part."""

    def __init__(self, req: PreparedRequest) -> None:
        self.req = req
        self.reported: set[int] = set()
        self.sent_text: dict[int, int] = {}  # characters of content sent
        self.sent_tokens: dict[int, int] = {}  # tokens whose logprobs were sent
        self.sent_calls: dict[int, int] = {}  # tool calls sent

    def lines(self, output, chunk) -> list[str]:
        """The SSE chunks one RequestOutput adds: new content (with its tokens' logprobs), tool calls, then the
        finish reason of completions that ended; with continuous usage, each with its choice's usage so far (one
        output may carry several tokens: a client that fell behind gets the outputs it missed merged,
        llm.engine.async_engine.merge_outputs)."""
        lines, req = [], self.req
        for c in output.outputs if output is not None else ():
            if c.index in self.reported:
                continue
            extra = {"usage": usage(output, [c])} if req.continuous_usage else {}
            delta, calls, reason = self._delta(c)
            logprobs = self._logprobs(c) if req.top_logprobs is not None else None
            if delta or logprobs and logprobs["content"]:
                body = {"index": c.index, "delta": {"content": delta}, "finish_reason": None}
                if logprobs is not None:
                    body["logprobs"] = logprobs
                lines.append(chunk([body], **extra))
            if calls:
                body = {"index": c.index, "delta": {"tool_calls": calls}, "finish_reason": None}
                lines.append(chunk([body], **extra))
            if c.finish_reason is not None:
                self.reported.add(c.index)
                lines.append(chunk([{"index": c.index, "delta": {}, "finish_reason": reason}], **extra))
        return lines

    def _delta(self, c) -> tuple[str, list[dict], str | None]:
        reason = FINISH_REASONS.get(c.finish_reason, c.finish_reason) if c.finish_reason is not None else None
        fmt = self.req.tools
        if fmt is None:
            return c.delta_text, [], reason
        text, i = c.text, c.index
        sent, sent_calls = self.sent_text.get(i, 0), self.sent_calls.get(i, 0)
        limit = None if self.req.parallel_tool_calls else 1
        if c.finish_reason is None:  # content up to a possible call marker; each call once its text is complete
            end = max(sent, fmt.content_end(text))
            self.sent_text[i] = end
            calls = fmt.complete_calls(text)[:limit]
            self.sent_calls[i] = len(calls)
            return text[sent:end], fmt.openai_calls(calls, sent_calls, indexed=True), None
        content, calls = fmt.parse(text)
        calls = calls[:limit]
        self.sent_calls[i] = len(calls)
        if not calls:
            self.sent_text[i] = len(text)
            return text[sent:], [], reason
        rest = (content or "")[sent:] if (content or "").startswith(text[:sent]) else ""
        deltas = fmt.openai_calls(calls, sent_calls, indexed=True)
        return rest, deltas, _with_calls(reason)

    def _logprobs(self, c) -> dict:
        sent = self.sent_tokens.get(c.index, 0)
        entries = c.logprobs or []
        self.sent_tokens[c.index] = len(entries)
        return chat_logprobs(self.req.texts, c.token_ids[sent:], entries[sent:], self.req.top_logprobs)
