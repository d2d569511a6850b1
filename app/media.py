"""Image loading with the server's safety rules: where an image may come from, how big it may be, what it becomes.

Every image ends as an 8-bit RGB `PIL.Image` whose pixels were fully decoded here, so a truncated
file, a decompression bomb or an odd mode (CMYK, 16-bit, alpha, palette, animation) never reaches
the model's processor.

Memory per request is bounded before a pixel is decoded: each image's header (size, mode) is
checked against `max_image_pixels`, all images of a request together against
`max_request_pixels`; a JPEG is decoded at the smallest 1/2, 1/4 or 1/8 scale that still covers
the working size; every image is scaled down to at most `max_working_pixels` before any mode
conversion (a palette image by nearest neighbour first, since converting it at full size to RGBA
costs four bytes a pixel); and each decode reserves its estimated peak in the server-wide
`MediaLimits.decoding` budget (app/decode_budget.py) while it runs.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import math
import os
import stat
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
from PIL import Image, ImageFile

from vlchat.app.errors import ForbiddenMediaError, MediaError
from vlchat.app.remote_fetch import fetch_remote
from vlchat.app.settings import MediaLimits

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")
MAX_PATH_CHARS = 4096
ImageSource = str | bytes | os.PathLike | Image.Image


def load_image(source: ImageSource, limits: MediaLimits, *, trusted_path: bool = False) -> Image.Image:
    """Return the image `source` names as RGB, at most `limits.max_working_pixels` large.

    Args:
        source: a data: URL, an http(s) URL, a file:// URL or path, raw bytes, or a PIL image.
        limits: size limits and where images may be read from.
        trusted_path: the path came from the server itself (a Gradio upload), not from a request.
    """
    return load_images([source], limits, trusted_path=trusted_path)[0]


def load_images(sources: list[ImageSource], limits: MediaLimits, *, trusted_path: bool = False) -> list[Image.Image]:
    """`load_image` for each of one request's images: every header is read and checked (with the request's total
    pixels) before any of them is decoded."""
    opened = [open_image(source, limits, trusted_path=trusted_path) for source in sources]
    total = sum(image.width * image.height for image in opened)
    if total > limits.max_request_pixels:
        raise MediaError(
            f"the images of this request have {total} pixels together, more than the limit of "
            f"{limits.max_request_pixels}; send fewer or smaller images"
        )
    return [decode_opened(image, limits) for image in opened]


def open_image(source: ImageSource, limits: MediaLimits, *, trusted_path: bool = False) -> Image.Image:
    """The image `source` names, its header read and checked, its pixels not decoded yet (a PIL image as it is)."""
    if isinstance(source, Image.Image):
        return _check_pixels(source, limits)
    if isinstance(source, (bytes, bytearray)):
        return open_bytes(bytes(source), limits)
    if isinstance(source, os.PathLike):
        return open_bytes(read_local(os.fspath(source), limits, trusted=trusted_path), limits)
    if not isinstance(source, str) or not source.strip():
        raise MediaError("an image reference must be a non-empty string (data: URL, http(s) URL or file path)")
    source = source.strip()
    scheme = source.split(":", 1)[0].lower() if ":" in source else ""
    if scheme == "data":
        return open_bytes(decode_data_url(source, limits), limits)
    if scheme in ("http", "https"):
        return open_bytes(fetch_remote(source, limits), limits)
    if scheme == "file":
        return open_bytes(read_local(unquote(urlparse(source).path), limits, trusted=trusted_path), limits)
    if len(scheme) > 1:  # a Windows drive letter is one character; anything longer is a URL scheme
        raise MediaError(f"image URLs with scheme {scheme!r} are not supported; use data:, http(s): or a file path")
    return open_bytes(read_local(source, limits, trusted=trusted_path), limits)


def decode_data_url(url: str, limits: MediaLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise MediaError("a data: URL needs a comma between its header and payload (data:image/png;base64,...)")
    if not header.endswith(";base64"):
        raise MediaError("only base64 data: URLs are supported (data:image/png;base64,...)")
    mime = header[len("data:") : -len(";base64")].lower()
    if mime and not mime.startswith("image/"):
        raise MediaError(f"a data: URL of type {mime!r} is not an image")
    if len(payload) > limits.max_image_bytes * 4 // 3 + 4:
        raise MediaError(f"the image is larger than the {limits.max_image_bytes} byte limit")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the data: URL payload is not valid base64") from None


def read_local(path: str, limits: MediaLimits, *, trusted: bool = False) -> bytes:
    if "\x00" in path:
        raise MediaError("image paths may not contain NUL characters")
    if len(path) > MAX_PATH_CHARS:
        raise MediaError(f"image paths may be {MAX_PATH_CHARS} characters long at most")
    if not trusted:
        root = limits.allowed_local_dir
        if root is None:
            raise ForbiddenMediaError(
                "local file paths are disabled on this server; send the image as a data: URL "
                "(or start the server with --allowed-local-media-path DIR)"
            )
        if ".." in Path(path).parts:
            raise ForbiddenMediaError("image paths may not contain '..'")
        real = os.path.realpath(os.path.join(root, path))  # resolves symlinks: a link out of root is refused
        if os.path.commonpath([real, root]) != root:
            raise ForbiddenMediaError(f"image paths must lie inside the allowed media directory {root}")
        path = real
    return _read_regular_file(path, limits.max_image_bytes)


def _read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`. Anything else (FIFO, socket, device, directory) is refused without
    waiting on it: the file is opened non-blocking, and checked both before opening and on the opened descriptor
    (it may have been replaced in between)."""
    shown = path if len(path) <= 200 else path[:200] + "..."
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise MediaError(f"{shown} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise MediaError(f"no image file at {shown}") from None
    except PermissionError:
        raise ForbiddenMediaError(f"the server may not read {shown}") from None
    except OSError as exc:  # a symlink loop, a name too long, a socket...
        raise MediaError(f"cannot open {shown}: {os.strerror(exc.errno) if exc.errno else exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(f"{shown} is not a regular file")
        if info.st_size > max_bytes:
            raise MediaError(f"the image is larger than the {max_bytes} byte limit")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while being read
        raise MediaError(f"the image is larger than the {max_bytes} byte limit")
    return data


def decode_image(data: bytes, limits: MediaLimits) -> Image.Image:
    return decode_opened(open_bytes(data, limits), limits)


def open_bytes(data: bytes, limits: MediaLimits) -> Image.Image:
    if not data:
        raise MediaError("the image is empty (0 bytes)")
    if len(data) > limits.max_image_bytes:
        raise MediaError(f"the image is larger than the {limits.max_image_bytes} byte limit")
    with _image_errors(limits):
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        return _check_pixels(image, limits)  # before decoding a single pixel


def decode_opened(image: Image.Image, limits: MediaLimits) -> Image.Image:
    """Decode an image from `open_image` within the server's decode budget; RGB, at most max_working_pixels."""
    target = working_size(image.size, limits.max_working_pixels)
    with _image_errors(limits):
        if getattr(image, "fp", None) is not None:  # not decoded yet (a PIL image passed in may be)
            image.seek(0)  # animated images: the first frame
            if image.format == "JPEG" and target != image.size:
                image.draft(None, target)  # decodes at 1/2, 1/4 or 1/8 scale, still covering target
        with limits.decoding.reserve(decode_cost(image, target)):
            _load_strict(image)
            return to_rgb(shrink(image, target))


@contextlib.contextmanager
def _image_errors(limits: MediaLimits):
    """Pillow's errors while opening or decoding become MediaErrors that say why (a bomb warning counts as one)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(f"the image has more than {limits.max_image_pixels} pixels") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise MediaError(f"the data is not a readable image ({_reason(exc)})") from None


def working_size(size: tuple[int, int], max_pixels: int) -> tuple[int, int]:
    """`size` scaled down, aspect kept, to at most `max_pixels` (unchanged when it fits)."""
    width, height = size
    if width * height <= max_pixels:
        return size
    scale = math.sqrt(max_pixels / (width * height))
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def decode_cost(image: Image.Image, target: tuple[int, int]) -> int:
    """Estimated peak bytes of decoding `image` and bringing it to `target` as `shrink` does: the frame as Pillow
    stores it (1, 2 or 4 bytes a pixel) and a working copy of it (premultiplied alpha, a mode conversion); for
    palette and 1-bit images the coarse copy in RGBA twice instead; the target in RGBA twice."""
    width, height = image.size
    per_pixel = 1 if image.mode in ("1", "L", "P") else 2 if image.mode.startswith("I;16") else 4
    frame = width * height * per_pixel
    if image.mode in ("P", "PA", "1") and (width, height) != target:
        coarse = min(width, 2 * target[0]) * min(height, 2 * target[1])
        return frame + 2 * 4 * coarse + 2 * 4 * target[0] * target[1]
    return 2 * frame + 2 * 4 * target[0] * target[1]


def shrink(image: Image.Image, target: tuple[int, int]) -> Image.Image:
    """`image` scaled down to `target` without converting it at full size: palette and 1-bit images are first
    reduced by nearest neighbour to at most twice the target, the rest (and then those) resampled."""
    if image.size == target:
        return image
    if image.mode in ("P", "PA", "1"):
        coarse = (min(image.width, 2 * target[0]), min(image.height, 2 * target[1]))
        image = image.resize(coarse, Image.Resampling.NEAREST)
        image = image.convert("RGBA" if image.mode != "1" else "L")
    return image.resize(target, Image.Resampling.LANCZOS, reducing_gap=2.0)


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB: 16-bit and float scaled down, CMYK converted, alpha and palettes composited over white."""
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or array.max(initial=0) > 255 else 255.0
        array = np.clip(array / top * 255.0, 0, 255).astype(np.uint8)
        image = Image.fromarray(array, mode="L")
    if image.mode == "P" or image.mode == "PA":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "La", "RGBa"):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def _check_pixels(image: Image.Image, limits: MediaLimits) -> Image.Image:
    width, height = image.size
    if width <= 0 or height <= 0:
        raise MediaError("the image has no pixels (width or height is 0)")
    if max(width, height) > limits.max_aspect_ratio * min(width, height):
        raise MediaError(
            f"the image is {width}x{height}, an aspect ratio over the limit of {limits.max_aspect_ratio:g}:1; "
            "crop or pad it"
        )
    if width * height > limits.max_image_pixels:
        raise MediaError(
            f"the image has {width}x{height} = {width * height} pixels, more than the limit of "
            f"{limits.max_image_pixels}; send a smaller image"
        )
    return image


def _load_strict(image: Image.Image) -> None:
    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        image.load()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def _reason(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    if "cannot identify image file" in text:
        return "unknown or unsupported format; send PNG, JPEG, GIF, WebP, BMP or TIFF"
    return text[:120] or type(exc).__name__
