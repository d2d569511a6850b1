"""Assertions shared by the reliability tests: an OpenAI-style error body, and a server that is still healthy."""

from __future__ import annotations

import time

import httpx

from tests.reliability.conftest import AUTH

ERROR_FIELDS = {"message", "type", "param", "code"}
# One client for the run (a new one per call costs ~50 ms); no keep-alive: a reused loopback connection
# answers ~40 ms late (delayed ACK), a fresh one in ~3 ms.
http = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def assert_openai_error(response: httpx.Response, status: int, needle: str) -> dict:
    """`response` is `status` with {"error": {message, type, param, code}} whose message or param names `needle`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"] and "Traceback" not in error["message"]
    assert needle.lower() in (error["message"] + " " + str(error["param"])).lower(), error
    return error


def wait_idle(engine, timeout_s: float = 10.0) -> None:
    """Wait until the engine holds no request and every KV block is free again."""
    total = engine.engine.block_manager.num_blocks
    deadline = time.monotonic() + timeout_s
    while (engine.engine.requests or engine.num_free_blocks() != total) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not engine.engine.requests, f"requests left in the engine: {list(engine.engine.requests)}"
    assert engine.num_free_blocks() == total, f"{engine.num_free_blocks()} of {total} KV blocks free"


def assert_healthy(server, engine) -> None:
    """/health answers ok, the engine is idle with every block free, and a new request still completes."""
    wait_idle(engine)
    health = http.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    body = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2, "temperature": 0}
    ok = http.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1, ok.text
    wait_idle(engine)
