"""Slow clients cannot hold the server: a request head must arrive within its deadline, a body may not stall, one
address may hold a bounded number of connections, and the server answers others meanwhile."""

from __future__ import annotations

import socket
import time

import pytest

from tests.app.live import LiveServer
from tests.reliability.checks import http
from vlchat.app.http_protocol import GuardedH11Protocol
from vlchat.app.model_choice import ModelChoice
from vlchat.app.server import build_app
from vlchat.app.settings import ServerConfig

SLOW = 60  # slow connections held open at once: bounded, as the issue asks


class QuickTimeouts(GuardedH11Protocol):
    """The production protocol with short deadlines and a small per-address cap, so the test takes seconds."""

    header_timeout_s = 1.0
    body_idle_timeout_s = 1.0
    max_connections_per_client = SLOW + 10


@pytest.fixture(scope="module")
def server(text_engine, text_model_dir):
    app = build_app(ServerConfig(api_key="k"), text_engine, ModelChoice(str(text_model_dir), "tiny"), with_ui=False)
    live = LiveServer(app, http=QuickTimeouts).start()
    yield live
    live.stop()


def connect(url: str) -> socket.socket:
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def test_slow_heads_and_stalled_bodies_are_cut_while_others_are_served(server):
    heads = [connect(server.url) for _ in range(SLOW // 2)]
    bodies = [connect(server.url) for _ in range(SLOW // 2)]
    for sock in heads:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    for sock in bodies:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messa")  # fmt: skip
    start = time.monotonic()
    ok = http.get(f"{server.url}/health")  # answered while the slow ones wait
    assert ok.status_code == 200
    chat = http.post(f"{server.url}/v1/chat/completions", headers={"Authorization": "Bearer k"},
                     json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})  # fmt: skip
    assert chat.status_code == 200, chat.text
    for sock in heads:
        sock.settimeout(15)
        assert read_all(sock).startswith(b"HTTP/1.1 408"), "a trickled head was not cut"
    for sock in bodies:
        sock.settimeout(15)
        answer = read_all(sock)
        assert not answer.startswith(b"HTTP/1.1 2"), answer[:200]  # cut, never served
    assert time.monotonic() - start < 15  # each was cut after ~1 s; this bound only stops a hang
    for sock in heads + bodies:
        sock.close()


def test_one_address_holds_a_bounded_number_of_connections(server):
    held = [connect(server.url) for _ in range(QuickTimeouts.max_connections_per_client)]
    try:
        extra = connect(server.url)
        extra.settimeout(10)
        assert read_all(extra).startswith(b"HTTP/1.1 503"), "the connection over the cap was not refused"
        extra.close()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)  # the server sees the closes
    assert http.get(f"{server.url}/health").status_code == 200


def test_a_slowly_sent_complete_request_is_still_served(server):
    """Bytes at a steady trickle, each well inside the idle limit and the whole head inside its deadline."""
    sock = connect(server.url)
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    for i in range(0, len(request), 16):
        sock.sendall(request[i : i + 16])
        time.sleep(0.05)
    sock.settimeout(10)
    assert read_all(sock).startswith(b"HTTP/1.1 200")
    sock.close()
