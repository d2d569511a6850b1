"""Bad input gets a clear OpenAI-style 4xx and the server stays healthy (server with --api-key and limits)."""

import os

import httpx
import pytest

from tests.app.conftest import API_KEY, BODY_LIMIT
from tests.images import data_url, png_claiming, red_png

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = {"role": "user", "content": "hi"}


def with_image(url: str, role: str = "user") -> dict:
    return {"messages": [{"role": role, "content": [{"type": "text", "text": "what?"},
                                                    {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip


BAD_BODIES = [
    ("wrong-type-max-tokens", {"messages": [USER], "max_tokens": "5"}, 400, "max_tokens"),
    ("wrong-type-temperature", {"messages": [USER], "temperature": "hot"}, 400, "temperature"),
    ("wrong-type-stream", {"messages": [USER], "stream": "yes"}, 400, "stream"),
    ("messages-not-a-list", {"messages": {"role": "user"}}, 400, "messages"),
    ("missing-messages", {"model": "tiny-llava"}, 400, "messages"),
    ("empty-messages", {"messages": []}, 400, "messages"),
    ("unknown-role", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("missing-content", {"messages": [{"role": "user"}]}, 400, "content"),
    ("unknown-part-type", {"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400, "audio"),
    ("unknown-model", {"messages": [USER], "model": "gpt-9"}, 404, "gpt-9"),
    ("max-tokens-zero", {"messages": [USER], "max_tokens": 0}, 400, "max_tokens"),
    ("max-completion-tokens-negative", {"messages": [USER], "max_completion_tokens": -3}, 400, "max_completion"),
    ("max-tokens-beyond-context", {"messages": [USER], "max_tokens": 100000}, 400, "context"),
    ("temperature-negative", {"messages": [USER], "temperature": -0.5}, 400, "temperature"),
    ("top-p-zero", {"messages": [USER], "top_p": 0}, 400, "top_p"),
    ("top-p-above-one", {"messages": [USER], "top_p": 1.5}, 400, "top_p"),
    ("n-zero", {"messages": [USER], "n": 0}, 400, "n"),
    ("n-too-large", {"messages": [USER], "n": 1000}, 400, "n must be"),
    ("too-many-stops", {"messages": [USER], "stop": [f"s{i}" for i in range(20)]}, 400, "stop"),
    ("empty-stop", {"messages": [USER], "stop": [""]}, 400, "stop"),
    ("invalid-base64", with_image("data:image/png;base64,@@@"), 400, "base64"),
    ("not-an-image", with_image(data_url(b"just some text, not pixels")), 400, "not a readable image"),
    ("truncated-png", with_image(data_url(red_png((64, 64))[:60])), 400, "not a readable image"),
    ("zero-pixels", with_image(data_url(png_claiming(0, 9))), 400, "image"),
    ("decompression-bomb", with_image(data_url(png_claiming(30000, 30000))), 400, "pixels"),
    ("image-in-assistant", with_image(data_url(red_png()), role="assistant"), 400, "only appear in user"),
    ("remote-url-not-allowed", with_image("http://127.0.0.1:9/a.png"), 403, "--allow-remote-images"),
    ("path-outside", with_image("/etc/passwd"), 403, "inside the allowed"),
    ("path-dotdot", with_image("../secret.png"), 403, ".."),
    ("too-many-images", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(red_png())}} for _ in range(3)]}]}, 400, "at most 2"),
]  # fmt: skip


@pytest.mark.parametrize("body, status, needle", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_request_bodies(locked_server, body, status, needle):
    response = httpx.post(f"{locked_server.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"] + str(error["param"]), error


@pytest.mark.parametrize(
    "content, needle",
    [(b"{not json", "not valid JSON"), (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8")],
    ids=["malformed-json", "invalid-utf8"],
)
def test_unreadable_bodies(locked_server, content, needle):
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{locked_server.url}/v1/chat/completions", content=content, headers=headers)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]


def test_oversized_body_is_a_413(locked_server):
    body = with_image(data_url(os.urandom(BODY_LIMIT)))
    response = httpx.post(f"{locked_server.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit still holds while reading
        for _ in range(BODY_LIMIT // 65536 + 2):
            yield b" " * 65536

    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{locked_server.url}/v1/chat/completions", content=chunks(), headers=headers)
    assert response.status_code == 413


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}],
                         ids=["missing", "wrong", "no-bearer"])  # fmt: skip
def test_api_key_is_required(locked_server, headers):
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", {"messages": [USER]})):
        response = httpx.request(method, f"{locked_server.url}{path}", json=body, headers=headers)
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{locked_server.url}/health").status_code == 200


def test_local_images_inside_the_allowed_directory(locked_server, media_root):
    (media_root / "ok.png").write_bytes(red_png())
    outside = media_root.parent / "outside.png"
    outside.write_bytes(red_png())
    (media_root / "link.png").unlink(missing_ok=True)
    os.symlink(outside, media_root / "link.png")
    escaped = httpx.post(f"{locked_server.url}/v1/chat/completions", json=with_image("link.png"), headers=AUTH)
    assert escaped.status_code == 403
    body = {**with_image("ok.png"), "max_tokens": 3}
    inside = httpx.post(f"{locked_server.url}/v1/chat/completions", json=body, headers=AUTH)
    assert inside.status_code == 200 and inside.json()["usage"]["completion_tokens"] >= 1


def test_unknown_route_and_health_after_abuse(locked_server):
    response = httpx.get(f"{locked_server.url}/v1/engines", headers=AUTH)
    assert response.status_code == 404 and "error" in response.json()
    ok = httpx.post(f"{locked_server.url}/v1/chat/completions", json={"messages": [USER], "max_tokens": 2},
                    headers=AUTH)  # fmt: skip
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
