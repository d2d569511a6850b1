"""The request head: answered only for the host names the server was started for (DNS rebinding), framed one way
only (RFC 9112), and a half-closed request treated as a client that left."""

from __future__ import annotations

import json
import socket

import pytest

from tests.app.live import start_server
from tests.reliability.checks import assert_healthy, assert_openai_error, http
from tests.reliability.conftest import AUTH
from vlchat.app.head_guard import HeadGuard, host_name
from vlchat.app.model_choice import ModelChoice

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/", "/gradio_api/info", "/v1/docs"])
@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", "localhost.evil.example",
                                  "", "127.0.0.1:80:80"])  # fmt: skip
def test_a_foreign_host_name_is_refused_on_every_route(text_server, host, path):
    response = http.get(f"{text_server.url}{path}", headers={**AUTH, "Host": host})
    assert_openai_error(response, 400, "host")


def test_a_foreign_host_cannot_generate(text_server):
    response = http.post(f"{text_server.url}/v1/chat/completions", json=CHAT, headers={**AUTH, "Host": "evil.example"})
    assert_openai_error(response, 400, "--allowed-hosts")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:7860", "localhost", "LOCALHOST:1234", "[::1]:80",
                                  "localhost."])  # fmt: skip
def test_the_loopback_names_are_answered(text_server, host):
    assert http.get(f"{text_server.url}/health", headers={"Host": host}).status_code == 200


def test_allowed_hosts_and_all_interfaces(text_engine, text_model_dir):
    choice = ModelChoice(str(text_model_dir), "tiny")
    server = start_server(text_engine, choice, with_ui=False, host="0.0.0.0", allowed_hosts=("chat.lan", "*.corp"))
    try:
        for host, status in [("chat.lan", 200), ("a.b.corp", 200), ("corp", 400), ("192.168.1.7:8000", 200),
                             ("[fe80::1]", 200), ("other.lan", 400)]:  # fmt: skip
            assert http.get(f"{server.url}/health", headers={"Host": host}).status_code == status, host
    finally:
        server.stop()


def test_host_names_are_read_like_a_browser_sends_them():
    assert [host_name(h) for h in ["Example.ORG:8080", "[::1]:7860", "a.b.", "x:y"]] == ["example.org", "::1", "a.b", ""]
    guard = HeadGuard(None, "127.0.0.1", ("*",))
    assert guard.allows("anything.example") and not guard.allows("")


def raw_exchange(url: str, request: bytes, half_close: bool = False) -> bytes:
    """Send `request` bytes on a fresh socket and read until the server closes it."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


BODY = json.dumps(CHAT).encode()
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + (
    f"Authorization: {AUTH['Authorization']}\r\n".encode()
)


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), len(BODY), BODY),
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
        # identical duplicates may be read as one (RFC 9112 section 6.3), different ones may not
        b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n%s" % (len(BODY), BODY),
    ],
    ids=["content-length-then-chunked", "chunked-then-content-length", "two-different-content-lengths"],
)
def test_ambiguous_framing_is_a_400_and_the_connection_closes(text_server, text_engine, framing):
    # the request carries a second one in its body: a server reading it by Content-Length would answer both
    answer = raw_exchange(text_server.url, HEAD + framing + HEAD + b"Content-Length: 0\r\n\r\n")
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 400 Bad Request", answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1
    assert_healthy(text_server, text_engine)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_half_closed_request_is_treated_as_a_client_that_left(text_server, text_engine, stream):
    """A client that shuts its sending side after the request is taken to have gone, as nginx does (a read end of
    file cannot be told apart from a full close without writing): the request is aborted, nothing is lost for the
    others and the server stays healthy."""
    body = json.dumps({**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": stream}).encode()
    answer = raw_exchange(text_server.url, HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body), half_close=True)
    assert not answer.startswith(b"HTTP/1.1 5"), answer[:300]
    assert_healthy(text_server, text_engine)
