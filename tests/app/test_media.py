"""Image loading rules: sources, size limits, broken files, odd modes, path escapes."""

import io
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from tests.images import animated_gif, data_url, encode, png_claiming
from vlchat.app.errors import ForbiddenMediaError, MediaError
from vlchat.app.media import load_image
from vlchat.app.settings import MediaLimits

LIMITS = MediaLimits()
RED = Image.new("RGB", (6, 4), (255, 0, 0))


def test_data_url_png_roundtrip():
    out = load_image(data_url(encode(RED)), LIMITS)
    assert out.mode == "RGB" and out.size == (6, 4) and out.getpixel((0, 0)) == (255, 0, 0)


@pytest.mark.parametrize(
    "source, match",
    [
        ("data:image/png;base64,!!!not-base64!!!", "not valid base64"),
        ("data:image/png,rawbytes", "only base64"),
        ("data:text/plain;base64,aGVsbG8=", "not an image"),
        (data_url(b"hello, I am not an image"), "not a readable image"),
        (data_url(b""), "empty"),
        (data_url(encode(RED)[:40]), "not a readable image"),
        (data_url(encode(Image.new("RGB", (64, 64), "blue"), "JPEG")[:300], "image/jpeg"), "not a readable image"),
        (data_url(png_claiming(0, 5)), "not a readable image|no pixels"),
        (data_url(png_claiming(20000, 20000)), "more than the limit|more than"),
        ("ftp://example.com/a.png", "not supported"),
        ("   ", "non-empty"),
    ],
    ids=["bad-base64", "not-base64-url", "text-mime", "not-image", "empty", "truncated-png", "truncated-jpeg",
         "zero-pixels", "decompression-bomb", "ftp", "blank"],
)  # fmt: skip
def test_bad_images_are_refused_with_a_reason(source, match):
    with pytest.raises(MediaError, match=match):
        load_image(source, LIMITS)


def test_size_limit_in_bytes():
    big = encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)))
    with pytest.raises(MediaError, match="byte limit"):
        load_image(data_url(big), MediaLimits(max_image_bytes=len(big) - 1))


def test_animated_gif_gives_first_frame():
    gif = animated_gif()  # three frames, the first red
    assert Image.open(io.BytesIO(gif)).n_frames == 3
    out = load_image(gif, LIMITS)
    assert out.mode == "RGB" and out.getpixel((3, 3)) == (255, 0, 0)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: encode(Image.new("CMYK", (5, 5), (0, 255, 255, 0)), "JPEG", quality=100), (255, 0, 0)),
        (lambda: encode(Image.fromarray(np.full((5, 5), 65535, dtype=np.uint16))), (255, 255, 255)),
        (lambda: encode(Image.new("RGBA", (5, 5), (0, 0, 0, 0))), (255, 255, 255)),
        (lambda: encode(Image.new("LA", (5, 5), (0, 255))), (0, 0, 0)),
        (lambda: encode(Image.new("RGB", (5, 5), (0, 200, 0)).convert("P")), (0, 200, 0)),
        (lambda: encode(Image.new("1", (5, 5), 1)), (255, 255, 255)),
    ],
    ids=["cmyk", "16-bit", "transparent-rgba", "gray-alpha", "palette", "1-bit"],
)
def test_modes_are_converted_to_rgb(make, expected):
    out = load_image(make(), LIMITS)
    assert out.mode == "RGB"
    assert np.abs(np.array(out.getpixel((2, 2))) - np.array(expected)).max() <= 8


def test_palette_with_transparency_is_composited_on_white():
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    out = load_image(encode(image, transparency=0), LIMITS)
    assert out.getpixel((1, 1)) == (255, 255, 255)


def test_extreme_aspect_ratios_are_refused():
    strip = encode(Image.new("RGB", (1, 300)))
    with pytest.raises(MediaError, match="aspect ratio"):
        load_image(strip, LIMITS)
    assert load_image(strip, MediaLimits(max_aspect_ratio=300)).size == (1, 300)


def test_pil_and_bytes_inputs():
    assert load_image(RED, LIMITS).size == (6, 4)
    assert load_image(encode(RED, "WEBP"), LIMITS).size == (6, 4)
    with pytest.raises(MediaError, match="more than the limit"):
        load_image(Image.new("RGB", (100, 100)), MediaLimits(max_image_pixels=9999))


def test_local_paths_need_an_allowed_directory(tmp_path):
    (tmp_path / "ok.png").write_bytes(encode(RED))
    with pytest.raises(ForbiddenMediaError, match="disabled"):
        load_image(str(tmp_path / "ok.png"), LIMITS)


def test_local_paths_stay_inside_the_allowed_directory(tmp_path):
    root, outside = tmp_path / "media", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (root / "ok.png").write_bytes(encode(RED))
    (outside / "secret.png").write_bytes(encode(RED))
    os.symlink(outside / "secret.png", root / "link.png")
    os.symlink(outside, root / "dirlink")
    limits = MediaLimits(allowed_local_dir=str(root))
    assert load_image(str(root / "ok.png"), limits).size == (6, 4)
    assert load_image("ok.png", limits).size == (6, 4)
    assert load_image(f"file://{root}/ok.png", limits).size == (6, 4)
    for escape in (f"{root}/../secret/secret.png", "../secret/secret.png", str(outside / "secret.png"),
                   str(root / "link.png"), "dirlink/secret.png", "/etc/passwd"):  # fmt: skip
        with pytest.raises(ForbiddenMediaError):
            load_image(escape, limits)
    with pytest.raises(MediaError, match="no image file"):
        load_image("missing.png", limits)


@pytest.fixture
def image_http_server():
    body = encode(RED)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/red.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_remote_urls_only_when_allowed(image_http_server):
    with pytest.raises(ForbiddenMediaError, match="--allow-remote-images"):
        load_image(f"{image_http_server}/red.png", LIMITS)
    allowed = MediaLimits(allow_remote=True, allow_private_remote=True)  # the test server is on loopback
    assert load_image(f"{image_http_server}/red.png", allowed).getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(MediaError, match="HTTP 404"):
        load_image(f"{image_http_server}/missing.png", allowed)
