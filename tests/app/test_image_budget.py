"""Bounded image decoding: images are scaled down to the working size without a full-size conversion, a request's
images share one pixel budget checked from their headers, and the server's decodes share one memory budget."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from tests.images import encode
from vlchat.app.decode_budget import DecodeBudget, ServerBusyError
from vlchat.app.errors import MediaError
from vlchat.app.media import decode_cost, load_image, load_images, open_image, working_size
from vlchat.app.settings import MediaLimits

SMALL_WORK = MediaLimits(max_working_pixels=40_000)


def palette_with_transparency(size=(600, 400)) -> bytes:
    """Left half transparent (index 0), right half red (index 1)."""
    image = Image.new("P", size, 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.paste(1, (size[0] // 2, 0, size[0], size[1]))
    return encode(image, transparency=0)


@pytest.mark.parametrize(
    "name, data",
    [
        ("palette-transparent", palette_with_transparency()),
        ("rgba", encode(Image.new("RGBA", (600, 400), (255, 0, 0, 255)))),
        ("rgb-jpeg", encode(Image.new("RGB", (600, 400), (255, 0, 0)), "JPEG", quality=95)),
        ("16-bit-gray", encode(Image.fromarray(np.full((400, 600), 65535, dtype=np.uint16)))),
        ("cmyk-jpeg", encode(Image.new("CMYK", (600, 400), (0, 255, 255, 0)), "JPEG", quality=95)),
        ("1-bit", encode(Image.new("1", (600, 400), 1))),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_large_images_come_out_at_the_working_size(name, data):
    out = load_image(data, SMALL_WORK)
    assert out.mode == "RGB" and out.size == working_size((600, 400), 40_000) == (244, 163)


def test_a_shrunk_palette_image_keeps_its_transparency_and_colours():
    out = np.asarray(load_image(palette_with_transparency(), SMALL_WORK))
    width = out.shape[1]
    assert (out[:, : width // 2 - 4] == 255).all()  # transparent: composited over white (resampling blurs the edge)
    assert (out[:, width // 2 + 4 :] == (255, 0, 0)).all()


def test_a_large_jpeg_is_decoded_at_a_reduced_scale():
    data = encode(Image.new("RGB", (4000, 3000), (0, 0, 255)), "JPEG", quality=90)
    image = open_image(data, SMALL_WORK)
    full = decode_cost(image, working_size(image.size, SMALL_WORK.max_working_pixels))
    target = working_size(image.size, SMALL_WORK.max_working_pixels)
    image.draft(None, target)
    assert image.size == (500, 375) and decode_cost(image, target) < full / 20
    assert load_image(data, SMALL_WORK).size == target


def test_small_images_are_untouched():
    assert load_image(encode(Image.new("RGB", (200, 200), (1, 2, 3))), SMALL_WORK).size == (200, 200)


def test_the_images_of_a_request_share_one_pixel_budget():
    limits = MediaLimits(max_request_pixels=500_000)
    one = encode(Image.new("RGB", (600, 400)))  # 240,000 pixels
    assert len(load_images([one, one], limits)) == 2
    with pytest.raises(MediaError, match="720000 pixels together, more than the limit of 500000"):
        load_images([one, one, one], limits)


def test_the_pixel_budget_is_checked_from_the_headers_before_any_decode():
    limits = MediaLimits(max_request_pixels=500_000, max_decode_bytes=1, decode_wait_s=0.01)
    one = encode(Image.new("RGB", (600, 400)))
    held = limits.decoding.reserve(1)
    held.__enter__()  # the server's budget is full: any decode would wait and then be refused as busy
    try:
        with pytest.raises(MediaError, match="pixels together"):
            load_images([one, one, one], limits)
        with pytest.raises(ServerBusyError, match="busy decoding"):
            load_images([one], limits)
    finally:
        held.__exit__(None, None, None)
    assert limits.decoding.in_use == 0


def test_decodes_wait_for_room_in_the_budget_and_one_larger_than_it_runs_alone():
    budget = DecodeBudget(max_bytes=100, wait_s=60)
    log, gate = [], threading.Event()

    def decode(name, nbytes):
        with budget.reserve(nbytes):
            log.append((name, "start", budget.in_use))
            if name == "first":
                gate.wait(60)
            log.append((name, "end"))

    first = threading.Thread(target=decode, args=("first", 60))
    first.start()
    while not log:
        threading.Event().wait(0.01)
    waiting = [threading.Thread(target=decode, args=(n, b)) for n, b in (("big", 500), ("small", 50))]
    for t in waiting:
        t.start()
    threading.Event().wait(0.2)
    assert log == [("first", "start", 60)]  # 60 + 50 and 60 + 500 do not fit 100: both wait
    gate.set()
    for t in [first, *waiting]:
        t.join(60)
    starts = [entry for entry in log if entry[1] == "start"]
    assert max(entry[2] for entry in starts) <= 500 and ("big", "start", 500) in starts  # the big one alone
    assert budget.in_use == 0


def test_a_decode_that_cannot_get_room_is_a_503():
    budget = DecodeBudget(max_bytes=10, wait_s=0.01)
    with budget.reserve(10), pytest.raises(ServerBusyError) as info, budget.reserve(5):
        pass
    assert info.value.status == 503 and "retry" in str(info.value)
