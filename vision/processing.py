"""OpenAI-style multimodal messages -> the model's HF processor -> token ids and per-image items.

Content parts: {"type": "text", "text": ...}, {"type": "image", "image": PIL image | path | bytes}
and {"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}. The processor's
own chat template and image preprocessing do the work; here the images are pulled out of
the messages, counted against the per-request limit, and each image's processor outputs
are matched with its run of placeholder tokens and hashed by content.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.inputs import ImageItem
from vlchat.llm.tokenizer import template_options, typed_control_tokens

DEFAULT_MAX_IMAGES = 8
# Per-request options forwarded to the HF image processor (Qwen's image token budget).
PROCESSOR_OPTIONS = ("min_pixels", "max_pixels")


def load_image(obj) -> Image.Image:
    """A PIL image (RGB) from a PIL image, a file path, raw bytes or a data: URL."""
    try:
        if isinstance(obj, Image.Image):
            image = obj
        elif isinstance(obj, (bytes, bytearray)):
            image = Image.open(io.BytesIO(obj))
        elif isinstance(obj, str) and obj.startswith("data:"):
            _, _, payload = obj.partition(",")
            image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        elif isinstance(obj, (str, Path)):
            if str(obj).startswith(("http://", "https://")):
                raise InvalidRequestError("image URLs are not fetched; send the image inline as a data: URL")
            image = Image.open(Path(obj))
        else:
            raise InvalidRequestError(f"an image must be a PIL image, a path, bytes or a data: URL, not {type(obj)}")
        image.load()
    except (OSError, UnidentifiedImageError, binascii.Error, ValueError) as e:
        if isinstance(e, InvalidRequestError):
            raise
        raise InvalidRequestError(f"cannot read the image ({e}); send a PNG, JPEG, GIF or WebP image") from e
    return image.convert("RGB")


def _part_image(part: Mapping):
    if part.get("type") == "image":
        if "image" not in part:
            raise InvalidRequestError('an {"type": "image"} part needs an "image" field')
        return part["image"]
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    if not isinstance(url, str):
        raise InvalidRequestError('an {"type": "image_url"} part needs {"image_url": {"url": "data:..."}}')
    return url


_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")  # what templates that take tools read besides the content


def split_messages(messages: list[Mapping], max_images: int) -> tuple[list[dict], list[Image.Image]]:
    """Messages for the HF chat template ({"type": "image"} placeholders) and the images in order."""
    out, images = [], []
    for message in messages:
        content = message.get("content")
        extra = {k: message[k] for k in _TOOL_KEYS if message.get(k) is not None}
        if isinstance(content, str) or content is None:  # plain text stays a string for the template
            out.append({"role": message["role"], "content": content or "", **extra})
            continue
        if not isinstance(content, list):
            raise InvalidRequestError("a message's content must be a string or a list of content parts")
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind in ("image", "image_url"):
                if len(images) >= max_images:
                    raise InvalidRequestError(
                        f"at most {max_images} images are allowed per request; send fewer images "
                        "or start a new conversation"
                    )
                images.append(load_image(_part_image(part)))
                parts.append({"type": "image"})
            else:
                raise InvalidRequestError(f"unsupported content part type {kind!r}; use text, image or image_url")
        out.append({"role": message["role"], "content": parts, **extra})
    return out, images


def run_processor(processor, messages: list[Mapping], mm_options: Mapping):
    """(token ids, processor outputs, prompt text, number of images) for one conversation."""
    max_images = int(mm_options.get("max_images", DEFAULT_MAX_IMAGES))
    hf_messages, images = split_messages(messages, max_images)
    template = template_options(mm_options)
    if getattr(processor, "chat_template", None) is None and "chat_template" not in template:
        raise InvalidRequestError("this model's processor has no chat template; it cannot take chat messages")
    typed = typed_control_tokens(processor.tokenizer, hf_messages, template.get("tools"))
    if typed:  # the processor tokenizes the whole rendered text: typed markers would become real ones
        raise InvalidRequestError(
            f"the text contains {typed[0]!r}, a control token of this model's chat format; remove it: do not type "
            "image placeholder or turn markers in the text (send images as image parts)"
        )
    text = processor.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=False, **template)
    kwargs = _image_kwargs(processor, mm_options)
    bos = getattr(processor.tokenizer, "bos_token", None)
    add_special = not (bos is not None and text.startswith(bos))
    try:
        outputs = processor(
            text=[text], images=images or None, return_tensors="pt", add_special_tokens=add_special, **kwargs
        )
    except ValueError as e:  # e.g. an image placeholder typed in the text: its count no longer matches the images
        raise InvalidRequestError(
            f"the model's processor refused this prompt ({e}); do not type image placeholder tokens in the text, "
            "send images as image parts"
        ) from None
    return outputs["input_ids"][0].tolist(), outputs, text, len(images)


def _image_kwargs(processor, mm_options: Mapping) -> dict:
    """Qwen's per-request pixel budget, as `size` where the image processor reads it from there."""
    wanted = {k: int(mm_options[k]) for k in PROCESSOR_OPTIONS if mm_options.get(k) is not None}
    size = getattr(getattr(processor, "image_processor", None), "size", None)
    try:
        size = {k: v for k, v in dict(size).items() if v is not None}
    except (TypeError, ValueError):
        return wanted
    if not wanted or "longest_edge" not in size:
        return wanted
    size.update({"shortest_edge" if k == "min_pixels" else "longest_edge": v for k, v in wanted.items()})
    return {"size": size}


def image_token_id(processor) -> int:
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None:
        token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int(token_id)


def content_hash(data: Mapping[str, torch.Tensor]) -> str:
    """A hash of the preprocessed pixels (and grid sizes): equal images give equal hashes."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(data):
        t = data[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def place_images(token_ids: list[int], placeholder: int, datas: list[dict], lengths: list[int]) -> list[ImageItem]:
    """Assign each image the next `length` placeholder tokens (they must be consecutive)."""
    positions = [i for i, t in enumerate(token_ids) if t == placeholder]
    if len(positions) != sum(lengths):
        raise InvalidRequestError(
            f"the prompt has {len(positions)} image placeholder tokens but its {len(datas)} images need "
            f"{sum(lengths)}; do not type the image token in the text"
        )
    items, cursor = [], 0
    for data, length in zip(datas, lengths, strict=True):
        span = positions[cursor : cursor + length]
        if span[-1] - span[0] + 1 != length:
            raise InvalidRequestError("an image's placeholder tokens are not consecutive; check the chat template")
        items.append(ImageItem(hash=content_hash(data), data=data, offset=span[0], length=length))
        cursor += length
    return items


def placeholder_runs(token_ids: list[int], placeholder: int) -> list[int]:
    """Lengths of the maximal runs of the placeholder token, in order."""
    runs, prev = [], False
    for t in token_ids:
        if t == placeholder:
            if prev:
                runs[-1] += 1
            else:
                runs.append(1)
        prev = t == placeholder
    return runs


def image_runs(token_ids: list[int], placeholder: int, num_images: int, hint: str) -> list[int]:
    """`placeholder_runs`, checked to be one run per image (`hint` says how to fix a prompt that is not)."""
    runs = placeholder_runs(token_ids, placeholder)
    if len(runs) != num_images:
        raise InvalidRequestError(f"found {len(runs)} image placeholder runs for {num_images} images; {hint}")
    return runs
