"""The Python client's inputs (issue 46): no images, history with image parts, a missing file, many images."""

import httpx
import pytest

from tests.app.live import start_server
from vlchat.app.client import Client, ImageNotFoundError
from vlchat.app.model_choice import EXAMPLES
from vlchat.app.settings import MediaLimits

ONE = EXAMPLES / "one-shape.png"
GREEDY = {"max_tokens": 4, "temperature": 0.0}


def test_images_none_is_a_text_question(server):
    with Client(server.url) as client:
        assert client.chat("Hello!", images=None, **GREEDY) == client.chat("Hello!", **GREEDY)


def test_history_with_image_parts_as_in_the_readme(server):
    history = [
        {"role": "user", "content": [{"type": "image", "image": str(ONE)}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A shape."},
    ]
    with Client(server.url) as client:
        with_image = client.chat("And its color?", history=history, **GREEDY)
        assert isinstance(with_image, str) and with_image


def test_a_missing_image_file_says_what_to_pass(server, tmp_path):
    with Client(server.url) as client, pytest.raises(ImageNotFoundError, match="pass an existing path") as caught:
        client.chat("What is this?", images=[tmp_path / "gone.png"])
    assert isinstance(caught.value, FileNotFoundError)


def test_max_images_above_eight_reaches_the_engine(tiny_engine, tiny_choice):
    server = start_server(tiny_engine, tiny_choice, with_ui=False, media=MediaLimits(max_images_per_request=10))
    try:
        with Client(server.url) as client:
            assert isinstance(client.chat("Count them.", images=[ONE] * 9, **GREEDY), str)
    finally:
        server.stop()


def test_mm_processor_kwargs_are_accepted_within_limits(server):
    def ask(kwargs):
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "mm_processor_kwargs": kwargs}
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)

    assert ask({"max_pixels": 200_000}).status_code == 200
    for bad, needle in [({"min_pixels": 900, "max_pixels": 100}, "min_pixels must not exceed max_pixels"),
                        ({"max_pixels": 10**12}, "over this server's limit"), ({"max_pixels": 0}, "max_pixels"),
                        ({"resize": 3}, "resize")]:  # fmt: skip
        response = ask(bad)
        assert response.status_code == 400 and needle in response.json()["error"]["message"], response.text
