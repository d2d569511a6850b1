"""Content parts -> images, the per-request image limit, content hashes and placeholder spans (no model needed)."""

import io

import pytest
import torch
from PIL import Image

from tests.images import data_url, red_png
from vlchat.llm.errors import InvalidRequestError
from vlchat.vision.processing import content_hash, load_image, place_images, placeholder_runs, split_messages


def test_image_sources_give_the_same_pixels(tmp_path):
    data = red_png((4, 3))
    path = tmp_path / "a.png"
    path.write_bytes(data)
    images = [load_image(x) for x in (data, str(path), path, data_url(data), Image.open(io.BytesIO(data)))]
    assert all(im.mode == "RGB" and im.tobytes() == images[0].tobytes() for im in images)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("https://example.com/cat.png", "not fetched"),
        ("data:image/png;base64,!!!notbase64", "cannot read the image"),
        (b"not an image", "cannot read the image"),
        (123, "must be a PIL image"),
    ],
    ids=["http-url", "bad-base64", "bad-bytes", "wrong-type"],
)
def test_bad_images_are_request_errors(bad, message):
    with pytest.raises(InvalidRequestError, match=message):
        load_image(bad)


def test_messages_split_into_template_parts_and_images():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image", "image": red_png((4, 3))},
                                     {"type": "image_url", "image_url": {"url": data_url(red_png((4, 3)))}}]},
    ]  # fmt: skip
    out, images = split_messages(messages, max_images=2)
    assert out[0]["content"] == "Be brief."
    assert [p["type"] for p in out[1]["content"]] == ["text", "image", "image"]
    assert len(images) == 2
    with pytest.raises(InvalidRequestError, match="at most 1 images"):
        split_messages(messages, max_images=1)
    with pytest.raises(InvalidRequestError, match="unsupported content part type 'audio'"):
        split_messages([{"role": "user", "content": [{"type": "audio"}]}], max_images=2)


def test_content_hash_follows_pixels_not_identity():
    a = {"pixel_values": torch.ones(1, 3, 2, 2)}
    assert content_hash(a) == content_hash({"pixel_values": torch.ones(1, 3, 2, 2)})
    assert content_hash(a) != content_hash({"pixel_values": torch.ones(1, 3, 2, 2) * 2})
    assert content_hash(a) != content_hash({"pixel_values": torch.ones(1, 3, 4, 1)})  # same bytes, other shape


def test_placeholders_are_assigned_in_order_and_must_add_up():
    ids = [1, 9, 9, 2, 9, 9, 9, 3]
    assert placeholder_runs(ids, 9) == [2, 3]
    items = place_images(ids, 9, [{"x": torch.zeros(1)}, {"x": torch.ones(1)}], [2, 3])
    assert [(i.offset, i.length) for i in items] == [(1, 2), (4, 3)]
    with pytest.raises(InvalidRequestError, match="5 image placeholder tokens but its 1 images need 4"):
        place_images(ids, 9, [{"x": torch.zeros(1)}], [4])
    with pytest.raises(InvalidRequestError, match="not consecutive"):
        place_images(ids, 9, [{"x": torch.zeros(1)}, {"x": torch.ones(1)}], [3, 2])
