"""The UI's API reads only files uploaded to it: file values are checked on the parsed JSON (escapes change nothing),
paths outside Gradio's upload folder and the examples are refused whether or not they exist, and unparseable or
absurdly nested bodies are 400s, not 500s."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.app.live import start_server
from tests.reliability.checks import assert_openai_error, wait_idle
from vlchat.app.model_choice import EXAMPLES, ModelChoice


@pytest.fixture(scope="module")
def ui_server(text_engine, text_model_dir):
    server = start_server(text_engine, ModelChoice(str(text_model_dir), "tiny", example_dirs=[EXAMPLES]))
    yield server
    server.stop()


@pytest.fixture
def recorded_downloads(monkeypatch):
    """Gradio's downloader replaced by a recorder that raises: nothing is contacted, every attempt is seen."""
    import gradio.processing_utils

    fetched = []

    async def recorder(url, cache_dir):
        fetched.append(url)
        raise OSError("the tests never download")

    monkeypatch.setattr(gradio.processing_utils, "async_ssrf_protected_download", recorder)
    return fetched


def chat_call(server, message: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": [message, "", 0.0, 1.0, 4, []]}, timeout=30)


ESCAPED_REMOTE_BODIES = [
    # the raw body spells neither "http" nor "gradio.FileData"; the parsed value is a remote file value
    b'{"data": [{"text": "hi", "files": [{"path": "\\u0068ttp://203.0.113.5/cat.png", '
    b'"meta": {"_type": "gradio\\u002eFileData"}}]}, "", 0.0, 1.0, 4]}',
    b'{"data": [{"text": "hi", "files": [{"path": "\\u0048TTPS://203.0.113.5/cat.png", '
    b'"meta": {"_type": "gradio.FileData"}}]}, "", 0.0, 1.0, 4]}',
    b'{"data": [{"text": "hi", "files": [{"pa\\u0074h": "https://203.0.113.5/cat.png", '
    b'"meta": {"_type": "gradio.File\\u0044ata"}}]}, "", 0.0, 1.0, 4]}',
]


@pytest.mark.parametrize("body", ESCAPED_REMOTE_BODIES, ids=["u0068ttp", "uppercase-escaped", "escaped-key"])
@pytest.mark.parametrize("route", ["call/chat", "queue/join"])
def test_json_escapes_do_not_get_a_remote_file_past_the_guard(ui_server, text_engine, recorded_downloads, body, route):
    if route == "queue/join":
        body = body[:-1] + b', "fn_index": 6, "session_hash": "s", "event_data": null}'
    response = httpx.post(f"{ui_server.url}/gradio_api/{route}", content=body,
                          headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
    assert_openai_error(response, 403, "--allow-remote-images")
    assert recorded_downloads == []
    wait_idle(text_engine)


@pytest.mark.parametrize(
    "body, needle",
    [
        (b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
        (b'{"data": ' + b"[" * 100 + b"]" * 100 + b"}", "nests deeper"),
        (b'{"data": [1, 2', "not valid JSON"),
        (b"data=1", "not valid JSON"),
        (b'{"data": [NaN, "\xff"]}', "not valid JSON"),
    ],
    ids=["100k-deep", "100-deep", "truncated", "form", "invalid-utf8"],
)
def test_unreadable_ui_bodies_are_400s(ui_server, body, needle):
    for route in ("call/chat", "run/predict", "queue/join"):
        response = httpx.post(f"{ui_server.url}/gradio_api/{route}", content=body,
                              headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
        assert_openai_error(response, 400, needle)


def chatbot_fn_index(server) -> int:
    """A UI event whose only input is the Chatbot (ChatInterface wires several)."""
    config = httpx.get(f"{server.url}/config", timeout=30).json()
    types = {c["id"]: c["type"] for c in config["components"]}
    return next(i for i, dep in enumerate(config["dependencies"]) if [types[x] for x in dep["inputs"]] == ["chatbot"])


def test_a_chatbot_value_cannot_make_gradio_open_a_server_path(ui_server, tmp_path):
    secret = tmp_path / "secret.png"
    secret.write_bytes((EXAMPLES / "one-shape.png").read_bytes())
    fn_index = chatbot_fn_index(ui_server)
    answers = []
    for path in (str(secret), str(tmp_path / "missing.png"), "/etc/passwd", f"{EXAMPLES}/../../app/cli.py"):
        history = [{"role": "user", "content": [{"component": "image", "value": {"path": path}, "constructor_args": {}, "props": {}}]}]
        response = httpx.post(f"{ui_server.url}/gradio_api/run/predict",
                              json={"data": [history], "fn_index": fn_index, "session_hash": "s"}, timeout=30)
        answers.append((response.status_code, response.json()["error"]["message"]))
    assert answers == [(403, answers[0][1])] * 4  # one answer, whether the file exists or not
    assert "uploaded" in answers[0][1]


def test_uploaded_and_example_files_still_pass(ui_server):
    fn_index = chatbot_fn_index(ui_server)
    upload = httpx.post(f"{ui_server.url}/gradio_api/upload", timeout=30,
                        files={"files": ("a.png", (EXAMPLES / "one-shape.png").read_bytes(), "image/png")})
    uploaded = upload.json()[0]
    for path in (uploaded, str(EXAMPLES / "one-shape.png")):
        history = [{"role": "user", "content": [{"component": "image", "value": {"path": path}, "constructor_args": {}, "props": {}}]}]
        response = httpx.post(f"{ui_server.url}/gradio_api/run/predict",
                              json={"data": [history], "fn_index": fn_index, "session_hash": "s"}, timeout=30)
        assert response.status_code == 200, response.text
    message = {"text": "hi", "files": [{"path": uploaded, "meta": {"_type": "gradio.FileData"}}]}
    call = chat_call(ui_server, message)
    assert call.status_code == 200, call.text
    events = httpx.get(f"{ui_server.url}/gradio_api/call/chat/{call.json()['event_id']}", timeout=60).text
    assert "event: complete" in events, events[:500]
    json.dumps(events)


@pytest.fixture(scope="module")
def keyed_server(text_engine, text_model_dir):
    """--api-key alone, UI on."""
    server = start_server(text_engine, ModelChoice(str(text_model_dir), "tiny"), api_key="the-key")
    yield server
    server.stop()


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/gradio_api/call/chat"),
        ("POST", "/gradio_api/queue/join"),
        ("POST", "/gradio_api/run/predict"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/docs"),
    ],
)
def test_api_key_alone_guards_every_route_that_can_generate_or_describe(keyed_server, method, path):
    """With --api-key and no --auth, Gradio's API generated for anyone and the API schema was open."""
    body = {"data": [{"text": "hi", "files": []}, "", 0.0, 1.0, 2], "fn_index": 6, "session_hash": "s"}
    response = httpx.request(method, f"{keyed_server.url}{path}", json=body if method == "POST" else None, timeout=30)
    assert response.status_code == 401, (path, response.status_code, response.text[:200])


def test_with_api_key_alone_the_key_opens_the_ui_and_the_schema(keyed_server):
    from gradio_client import Client

    headers = {"Authorization": "Bearer the-key"}
    assert httpx.get(f"{keyed_server.url}/v1/openapi.json", headers=headers, timeout=30).json()["paths"]
    assert "swagger" in httpx.get(f"{keyed_server.url}/v1/docs", headers=headers, timeout=30).text.lower()
    client = Client(keyed_server.url, auth=("anyone", "the-key"), verbose=False)
    try:
        assert isinstance(client.predict({"text": "hi", "files": []}, "", 0.0, 0.95, 2, api_name="/chat"), str)
    finally:
        client.close()
    with pytest.raises(Exception, match="(?i)login|credentials|auth"):
        Client(keyed_server.url, auth=("anyone", "wrong"), verbose=False)


def test_the_ui_queue_is_bounded_with_a_busy_answer(text_engine, text_model_dir):
    """UI chats beyond the running and waiting limits are refused at once (503 "queue is full"), instead of piling
    up without bound; the accepted ones complete."""
    from concurrent.futures import ThreadPoolExecutor

    server = start_server(text_engine, ModelChoice(str(text_model_dir), "tiny"), ui_concurrency=1, ui_queue_size=2)
    try:
        def post(_):
            return chat_call(server, {"text": "Tell me a long story.", "files": []})

        with ThreadPoolExecutor(20) as pool:
            responses = list(pool.map(post, range(20)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 503} and statuses.count(503) >= 1, statuses
        assert all("queue is full" in r.text.lower() for r in responses if r.status_code == 503)
        for response in responses:
            if response.status_code == 200:
                events = httpx.get(f"{server.url}/gradio_api/call/chat/{response.json()['event_id']}", timeout=120)
                assert "event: complete" in events.text, events.text[:300]
    finally:
        server.stop()
    wait_idle(text_engine)
