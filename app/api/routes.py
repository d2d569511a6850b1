"""The /v1 routes: chat completions, models; Bearer-key check; a client that goes away aborts its request."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from vlchat.app.api.completions import complete, open_stream, prepare
from vlchat.app.api.errors import error_response
from vlchat.app.api.protocol import ChatCompletionRequest
from vlchat.app.errors import AuthError, ModelNotFoundError
from vlchat.app.settings import ServerConfig


def build_router(config: ServerConfig, engine, model_name: str, openapi: Callable[[], dict] | None = None) -> APIRouter:
    """The /v1 routes. `openapi`: the app's schema, served here at /v1/openapi.json and /v1/docs behind the key (the
    app's own schema routes are open to anyone)."""
    created = int(time.time())

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthError("this server needs an API key: send the header 'Authorization: Bearer KEY'")
        if not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise AuthError("the API key is wrong; use the key the server was started with (--api-key)")

    router = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    card = {"id": model_name, "object": "model", "created": created, "owned_by": "vlchat",
            "max_model_len": getattr(engine, "max_model_len", None)}  # fmt: skip

    @router.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @router.get("/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id != model_name:
            raise ModelNotFoundError(f"model {model_id!r} is not served here; GET /v1/models lists {model_name!r}")
        return card

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        prepared = await prepare(body, config, engine, model_name)
        if body.stream:
            lines = await open_stream(engine, prepared)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(lines, media_type="text/event-stream", headers=headers)
        task = asyncio.ensure_future(complete(engine, prepared))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not task.done():  # the client went away: cancelling the stream aborts the engine request at once
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return JSONResponse({}, status_code=499)
        return JSONResponse(task.result())

    if openapi is not None:

        @router.get("/openapi.json", include_in_schema=False)
        async def schema() -> JSONResponse:
            return JSONResponse(openapi())

        @router.get("/docs", include_in_schema=False)
        async def docs() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/v1/openapi.json", title="vlchat API")

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    async def unknown(path: str, request: Request) -> JSONResponse:
        message = f"no route {request.method} /v1/{path}; the API has GET /v1/models and POST /v1/chat/completions"
        return error_response(message, 404, code="unknown_url")

    return router


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects: the body is read already, so the next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
