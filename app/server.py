"""`vlchat serve`: one FastAPI app with the Gradio UI at /, the OpenAI-compatible API at /v1 and GET /health."""

from __future__ import annotations

import errno
import hmac
import logging
import secrets
import socket
import sys
import threading

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from vlchat.app import __version__
from vlchat.app.api.errors import body_too_large, install_error_handlers
from vlchat.app.api.metrics import MeteredEngine, Metrics
from vlchat.app.api.routes import build_extra_router, build_router
from vlchat.app.errors import ConfigError
from vlchat.app.head_guard import HeadGuard
from vlchat.app.heap import return_large_frees_to_the_system
from vlchat.app.http_protocol import GuardedH11Protocol
from vlchat.app.model_choice import ModelChoice
from vlchat.app.settings import ServerConfig, quiet_gradio_defaults
from vlchat.app.ui_file_guard import UiFileGuard

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
    if config.api_key is None:
        app = FastAPI(title="vlchat", version=__version__, docs_url="/v1/docs", openapi_url="/v1/openapi.json")
    else:  # the schema and docs are served by the router, behind the key like every /v1 route
        app = FastAPI(title="vlchat", version=__version__, docs_url=None, openapi_url=None)
    install_error_handlers(app)
    metrics = Metrics(engine, model.name)
    engine = MeteredEngine(engine, metrics)  # the API and the browser UI: every finished request is recorded
    app.include_router(build_router(config, engine, model.name, app.openapi if config.api_key else None))
    app.include_router(build_extra_router(config, engine, model.name, metrics))

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "ok", "model": model.name, "untrained": model.untrained, "version": __version__}
        if getattr(engine, "errored", False):
            return JSONResponse({**body, "status": "error"}, status_code=503)
        return JSONResponse(body)

    if with_ui:
        quiet_gradio_defaults()
        import gradio as gr

        from vlchat.app.ui import CSS, build_ui
        from vlchat.app.ui_jobs import ResultReaders, UiJobRoutes

        readers = ResultReaders(config.ui_result_wait_s)
        blocks = build_ui(engine, model, config, readers)
        app = gr.mount_gradio_app(
            app,
            blocks,
            path="/",
            auth=ui_login(config),
            max_file_size=config.media.max_image_bytes,
            allowed_paths=[str(p) for p in model.example_dirs],
            server_name=config.host,
            server_port=config.port,
            footer_links=["api", "settings"],
            css=CSS,
        )
        # Gradio checks that file paths in a request were uploaded by a user only once `launch()` ran;
        # a mounted app never launches, so without this any image file on the server could be named.
        blocks.has_launched = True
        from gradio.utils import get_upload_folder

        readable = [get_upload_folder(), *(str(p) for p in model.example_dirs)]  # what Gradio may open
        app.add_middleware(UiJobRoutes, readers=readers, queue_size=config.ui_queue_size)
        app.add_middleware(UiFileGuard, allowed_dirs=readable, allow_remote=config.media.allow_remote)
    if config.cors_origins:  # without it browsers allow only the server's own origin
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])  # fmt: skip
    app.add_middleware(BodySizeLimit, limit=config.max_request_bytes)
    allowed = (*config.allowed_hosts, *(("*.gradio.live",) if config.share else ()))
    app.add_middleware(HeadGuard, host=config.host, allowed_hosts=allowed)  # outermost: the first to run
    return app


def ui_login(config: ServerConfig):
    """What Gradio's login accepts: --auth, or with --api-key alone any user name and the key as password, so that
    the UI and the Gradio API behind it (which can generate too) are never open when /v1 is guarded."""
    if config.auth is not None or config.api_key is None:
        return config.auth
    key = config.api_key.encode()
    return lambda _user, password: hmac.compare_digest(str(password).encode(), key)


def warn_if_unprotected(config: ServerConfig) -> None:
    if config.share and config.unprotected:
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: --share publishes this server on the internet WITHOUT --auth or --api-key:\n"
            f"anyone with the link can use your model and GPU. Add --auth USER:PASS and --api-key KEY.\n{bar}",
            file=sys.stderr,
        )
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


def check_port_free(host: str, port: int) -> None:
    """Raise ConfigError when `host:port` cannot be bound (another server has it, or the address is not ours)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ConfigError(f"--host {host!r} is not an address of this machine; use 127.0.0.1 or 0.0.0.0") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closing socket is no clash
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use; stop the program using it or pick "
                                  "another with --port N") from None  # fmt: skip
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pick another --host or --port"
            ) from None


def serve(config: ServerConfig) -> int:
    """Load the model, start the engine and serve until interrupted."""
    import uvicorn

    from vlchat.app.model_choice import resolve_model, start_engine

    quiet_gradio_defaults()
    warn_if_unprotected(config)
    check_port_free(config.host, config.port)  # before the model loads: a taken port fails in a second, not later
    return_large_frees_to_the_system()  # before the model loads: its large blocks follow the same rule
    model = resolve_model(config.model, served_name=config.served_model_name)
    engine = start_engine(model, config.engine_options)
    app = build_app(config, engine, model)
    if config.share:
        start_share_link(config)
    print(f"vlchat {__version__}: {model.describe()} at http://{config.host}:{config.port}", file=sys.stderr)
    print(kv_capacity_line(engine), file=sys.stderr)
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=2,
                    http=GuardedH11Protocol)  # fmt: skip
    finally:
        engine.shutdown()
    return 0
