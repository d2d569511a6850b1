"""A real vlchat server on a free 127.0.0.1 port, in a thread of the test process, over a real engine."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from vlchat.app.http_protocol import GuardedH11Protocol
from vlchat.app.model_choice import ModelChoice, resolve_model
from vlchat.app.server import build_app
from vlchat.app.settings import ServerConfig


class LiveServer:
    """uvicorn serving `app` until `stop()`; `url` is its base URL."""

    def __init__(self, app, http=GuardedH11Protocol):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, ws="none",
                                http=http)  # `vlchat serve` runs GuardedH11Protocol  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


class AbortRecorder:
    """An engine with the request ids the app aborts recorded (serve it with `start_server`)."""

    def __init__(self, engine) -> None:
        self._engine, self.aborted = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await self._engine.abort(request_id)


def wait_until(predicate, timeout: float, what: str):
    """Poll predicate until it returns something truthy (returned) or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_engine_idle(engine, free_blocks: int | None = None, timeout: float = 60) -> None:
    """Wait until the engine holds no request, runs and queues none, and `free_blocks` KV blocks (default: all)
    are free."""
    want = engine.engine.block_manager.num_blocks if free_blocks is None else free_blocks

    def idle():
        stats = engine.stats()
        return not engine.engine.requests and stats.num_running == stats.num_waiting == 0 and (
            engine.num_free_blocks() == want)  # fmt: skip

    wait_until(idle, timeout, f"the engine to hold no request and {want} free KV blocks")


def demo_choice() -> ModelChoice:
    return resolve_model(None)


def start_server(engine, choice: ModelChoice, with_ui: bool = True, **config) -> LiveServer:
    return LiveServer(build_app(ServerConfig(**config), engine, choice, with_ui=with_ui)).start()


def start_engine(model_dir: str | Path, **options):
    from vlchat.llm import AsyncEngine, EngineConfig

    options.setdefault("num_blocks", 256)
    options.setdefault("max_model_len", 512)
    return AsyncEngine.from_config(EngineConfig.from_options(str(model_dir), **options))
