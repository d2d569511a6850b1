"""DNS rebinding: requests are answered only for the host names the server was started for."""

from __future__ import annotations

import pytest

from tests.app.live import start_server
from tests.reliability.checks import assert_openai_error, http
from tests.reliability.conftest import AUTH
from vlchat.app.host_guard import HostGuard, host_name
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
    guard = HostGuard(None, "127.0.0.1", ("*",))
    assert guard.allows("anything.example") and not guard.allows("")
