"""Memory and time per request are bounded before the expensive work: image headers and a request's total pixels are
checked before decoding, images are decoded small and within a server-wide budget, and text is measured before it is
tokenized. Measured on `vlchat serve` as its own process (tests/reliability/served.py) with its default limits."""

from __future__ import annotations

import base64
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from tests.reliability.served import ServedProcess

MB = 1024 * 1024
PEAK_BOUND_MB = 512  # the target: any request within the documented limits


def palette_png(width: int, height: int) -> bytes:
    """A few kB: one red pixel column on a transparent palette background (decodes to ~4 bytes a pixel in RGBA)."""
    image = Image.new("P", (width, height), 0)
    image.putpalette([255, 255, 255, 255, 0, 0] + [0] * 762)
    image.paste(1, (0, 0, 1, height))
    out = io.BytesIO()
    image.save(out, "PNG", transparency=0)
    return out.getvalue()


def image_request(images: list[bytes], text: str = "What is this?") -> dict:
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(d).decode()}}
             for d in images]  # fmt: skip
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}], "max_tokens": 2,
            "temperature": 0}  # fmt: skip


def post(server: ServedProcess, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = ServedProcess(tmp_path_factory.mktemp("served"))
    small = palette_png(64, 48)
    for _ in range(2):  # the processor loads on first use; the second request shows the steady state
        assert post(served, image_request([small])).status_code == 200, served.output()
    yield served
    served.stop()


def test_big_palette_images_within_the_limits_stay_under_the_peak_bound(server):
    """Three requests at once, each with two 6000 x 6600 palette PNGs with transparency (~79 MP together, within the
    80 MP per-request limit): the server's peak RSS rises by less than 512 MB over its idle level."""
    side = (6000, 6600)  # 39.6 MP: within the default 40 MP per image and, twice, the default 80 MP per request
    body = image_request([palette_png(*side)] * 2)
    idle = server.rss_mb()
    server.reset_peak()
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda _: post(server, body), range(3)))
    assert [r.status_code for r in responses] == [200] * 3, [r.text for r in responses]
    rise = server.peak_mb() - idle
    print(f"idle {idle:.0f} MB, peak rise {rise:.0f} MB for 3 concurrent requests of 2 x 6000x6600 palette PNGs")
    assert rise < PEAK_BOUND_MB


def test_a_request_over_the_pixel_budget_is_refused_before_decoding(server):
    """Eight such images (317 MP together) took seconds and gigabytes; now the headers alone refuse them."""
    body = image_request([palette_png(6000, 6600)] * 8)
    idle = server.rss_mb()
    server.reset_peak()
    start = time.monotonic()
    response = post(server, body)
    elapsed = time.monotonic() - start
    assert response.status_code == 400 and "pixels" in response.json()["error"]["message"], response.text
    rise = server.peak_mb() - idle
    print(f"refused in {elapsed:.2f} s, peak rise {rise:.0f} MB")
    assert rise < 100


TEXT_30_MB = "hello world " * (30 * MB // 12)
TEXT_ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT_30_MB}], "max_tokens": 2}),
    "tokenize-prompt": ("/tokenize", {"prompt": TEXT_30_MB}),
    "tokenize-messages": ("/tokenize", {"messages": [{"role": "user", "content": TEXT_30_MB}]}),
    "tool-call-arguments": ("/tokenize", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": TEXT_30_MB}}]}]}),
}  # fmt: skip


@pytest.mark.parametrize("route", TEXT_ROUTES)
def test_a_30_mb_text_is_refused_before_it_is_tokenized(server, route):
    """30 MB of text (within the default 64 MB body limit) took 46 s and 5.7 GB before its 400 (chat; /tokenize took
    as long and answered 200); the text's length alone shows it cannot fit the context, so it is refused before the
    tokenizer sees it."""
    path, body = TEXT_ROUTES[route]
    content = json.dumps(body).encode()  # encoded beforehand: the time measured is the server's
    idle = server.rss_mb()
    server.reset_peak()
    start = time.monotonic()
    response = httpx.post(f"{server.url}{path}", content=content, timeout=300,
                          headers={"Content-Type": "application/json"})  # fmt: skip
    elapsed = time.monotonic() - start
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "characters" in error["message"], error
    rise = server.peak_mb() - idle
    print(f"30 MB text refused by {route} in {elapsed:.2f} s, peak rise {rise:.0f} MB")
    assert elapsed < 10  # 1 s or less measured; the margin is for a loaded CI machine
    assert rise < 200
