"""Test images and their encodings (bytes, data URLs): plain ones, and for the bad-input tests broken ones,
hostile ones, and odd modes that must be converted."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image

RED = (255, 0, 0)


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_claiming(width: int, height: int) -> bytes:
    """A valid PNG header that claims width x height, with an empty IDAT: cheap to send, huge (or empty) to decode."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def red_png(size=(8, 8)) -> bytes:
    return encode(Image.new("RGB", size, RED))


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (8, 8), c) for c in (RED, (0, 255, 0), (0, 0, 255))]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40, loop=0)


def palette_png(transparent: bool = False) -> bytes:
    image = Image.new("P", (8, 8), 1)
    image.putpalette([255, 255, 255] + list(RED) + [0] * 762)
    return encode(image, transparency=0) if transparent else encode(image)


def odd_modes() -> dict[str, tuple[bytes, bytes | None]]:
    """name -> (image bytes, an 8-bit RGB PNG with the pixels it must convert to, or None where lossy)."""
    white = encode(Image.new("RGB", (8, 8), (255, 255, 255)))
    return {
        "animated-gif-first-frame": (animated_gif(), red_png()),
        "cmyk-jpeg": (encode(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=100), None),
        "16-bit-gray": (encode(Image.fromarray(np.full((8, 8), 65535, dtype=np.uint16))), white),
        "rgba-opaque": (encode(Image.new("RGBA", (8, 8), (*RED, 255))), red_png()),
        "rgba-transparent": (encode(Image.new("RGBA", (8, 8), (0, 0, 0, 0))), white),
        "palette": (palette_png(), red_png()),
        "palette-transparent-index": (encode(Image.new("P", (8, 8), 0), transparency=0), white),
        "gray-alpha": (encode(Image.new("LA", (8, 8), (0, 0))), white),
        "1-bit": (encode(Image.new("1", (8, 8), 1)), white),
    }
