"""POST /tokenize and /detokenize (as vLLM serves them): the model's own tokenizer and chat template.

Bounded as a chat request is: text too long to fit the context is refused by its length before it is tokenized
(the engine's character bound), and neither route answers with more tokens than the context holds (vLLM answers a
longer prompt's whole token list; here the 400 says how many tokens it has)."""

from __future__ import annotations

import asyncio

from vlchat.app.api.protocol import DetokenizeRequest, TokenizeRequest
from vlchat.app.api.tools import template_message
from vlchat.app.errors import AppError, ModelNotFoundError
from vlchat.app.settings import ServerConfig


def _check_model(model: str | None, model_name: str) -> None:
    if model not in (None, "", model_name):
        raise ModelNotFoundError(f"model {model!r} is not served here; GET /v1/models lists {model_name!r}")


async def tokenize(body: TokenizeRequest, config: ServerConfig, engine, model_name: str) -> dict:
    _check_model(body.model, model_name)
    if body.prompt is not None:
        ids = await engine.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        messages = []
        for m in body.messages:
            if not isinstance(m.content, (str, type(None))) and any(p.type != "text" for p in m.content):
                raise AppError("/tokenize counts text only; remove the image parts", param="messages")
            text = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
            entry = {"role": "system" if m.role == "developer" else m.role, "content": text or ""}
            if m.tool_calls:
                entry["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id:
                entry["tool_call_id"] = m.tool_call_id
            messages.append(template_message(entry))
        options = {"chat_template": config.chat_template} if config.chat_template else {}
        if body.tools:
            options["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
        ids = await engine.tokenize(messages, options or None)
    ids, max_len = list(ids), engine.max_model_len
    if len(ids) > max_len:
        raise AppError(f"the prompt is {len(ids)} tokens long, over the model's context of {max_len} tokens",
                       param="messages" if body.prompt is None else "prompt",
                       code="context_length_exceeded")  # fmt: skip
    return {"count": len(ids), "max_model_len": max_len, "tokens": ids}


async def detokenize(body: DetokenizeRequest, engine, model_name: str) -> dict:
    _check_model(body.model, model_name)
    max_len = engine.max_model_len
    if len(body.tokens) > max_len:
        raise AppError(f"{len(body.tokens)} tokens sent; at most {max_len} (the model's context) are detokenized",
                       param="tokens")  # fmt: skip
    vocab = len(engine.tokenizer)
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise AppError(f"token ids must lie in [0, {vocab}); got {bad[:5]}", param="tokens")
    return {"prompt": await asyncio.to_thread(engine.tokenizer.decode, body.tokens)}
