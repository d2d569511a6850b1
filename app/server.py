"""`vlchat serve`: one FastAPI app with the Gradio UI at /, the OpenAI-compatible API at /v1 and GET /health."""

from __future__ import annotations

import logging
import secrets
import sys
import threading

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from vlchat.app import __version__
from vlchat.app.api.errors import body_too_large, install_error_handlers
from vlchat.app.api.routes import build_router
from vlchat.app.model_choice import ModelChoice
from vlchat.app.remote_file_guard import RemoteFileGuard
from vlchat.app.settings import ServerConfig, quiet_gradio_defaults

log = logging.getLogger("vlchat.server")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class BodySizeLimit:
    """Refuse request bodies over `limit` bytes with a 413, whether or not Content-Length is sent.

    Every path: the UI's JSON routes (queue/join, run/...) would otherwise read a body of any size.
    """

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                scope["vlchat.body_too_large"] = self.limit  # FastAPI turns the exception into a 400; see errors.py
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send):
        await body_too_large(self.limit)(scope, receive, send)


class _TooLarge(Exception):
    pass


def build_app(config: ServerConfig, engine, model: ModelChoice, *, with_ui: bool = True) -> FastAPI:
    """The whole server over an already started engine."""
    app = FastAPI(title="vlchat", version=__version__, docs_url="/v1/docs", openapi_url="/v1/openapi.json")
    install_error_handlers(app)
    app.include_router(build_router(config, engine, model.name))

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "ok", "model": model.name, "untrained": model.untrained, "version": __version__}
        if getattr(engine, "errored", False):
            return JSONResponse({**body, "status": "error"}, status_code=503)
        return JSONResponse(body)

    if with_ui:
        quiet_gradio_defaults()
        import gradio as gr

        from vlchat.app.ui import build_ui

        blocks = build_ui(engine, model, config)
        app = gr.mount_gradio_app(
            app,
            blocks,
            path="/",
            auth=config.auth,
            max_file_size=config.media.max_image_bytes,
            allowed_paths=[str(p) for p in model.example_dirs],
            server_name=config.host,
            server_port=config.port,
            footer_links=["api", "settings"],
        )
        # Gradio checks that file paths in a request were uploaded by a user only once `launch()` ran;
        # a mounted app never launches, so without this any image file on the server could be named.
        blocks.has_launched = True
        if not config.media.allow_remote:
            app.add_middleware(RemoteFileGuard)  # inside the body limit: it reads bounded bodies only
    app.add_middleware(BodySizeLimit, limit=config.max_request_bytes)
    return app


def warn_if_unprotected(config: ServerConfig) -> None:
    if config.share and config.unprotected:
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: --share publishes this server on the internet WITHOUT --auth or --api-key:\n"
            f"anyone with the link can use your model and GPU. Add --auth USER:PASS and --api-key KEY.\n{bar}",
            file=sys.stderr,
        )
    elif config.share and config.auth is None:  # --api-key guards /v1 only
        print("warning: --share without --auth: the browser UI (and the Gradio API behind it) is open to anyone "
              "with the link; --api-key protects /v1 only. Add --auth USER:PASS.", file=sys.stderr)  # fmt: skip
    elif config.unprotected and config.host not in LOOPBACK:
        print(f"warning: serving on {config.host} without --auth or --api-key: anyone who can reach it may use it",
              file=sys.stderr)  # fmt: skip


def kv_capacity_line(engine) -> str:
    """What the KV pool holds, printed at start: tokens in all, the cache format and the context limit."""
    cache = engine.config.cache
    return (
        f"KV cache: {engine.kv_cache_tokens:,} tokens ({cache.kv_cache_dtype} cache, {cache.block_size}-token "
        f"blocks), max_model_len {engine.max_model_len:,}"
    )


def start_share_link(config: ServerConfig) -> None:
    """Ask Gradio for a public link in the background; when it cannot be made, say so in one line."""

    def run():
        try:
            from gradio import networking

            url = networking.setup_tunnel("127.0.0.1", config.port, secrets.token_urlsafe(32), None, None)
            print(f"Public link: {url}", file=sys.stderr)
        except Exception as exc:  # no network, blocked, or Gradio's share server down
            print(f"Could not create a share link ({type(exc).__name__}); serving locally only.", file=sys.stderr)

    threading.Thread(target=run, name="vlchat-share", daemon=True).start()


def serve(config: ServerConfig) -> int:
    """Load the model, start the engine and serve until interrupted."""
    import uvicorn

    from vlchat.app.model_choice import resolve_model, start_engine

    quiet_gradio_defaults()
    warn_if_unprotected(config)
    model = resolve_model(config.model, served_name=config.served_model_name)
    engine = start_engine(model, config.engine_options)
    app = build_app(config, engine, model)
    if config.share:
        start_share_link(config)
    print(f"vlchat {__version__}: {model.describe()} at http://{config.host}:{config.port}", file=sys.stderr)
    print(kv_capacity_line(engine), file=sys.stderr)
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=2)
    finally:
        engine.shutdown()
    return 0
