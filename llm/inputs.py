"""Prompt normalisation: every accepted prompt form becomes one `MultiModalPrompt`.

Accepted prompts: a string (tokenized with the model's tokenizer, BOS as the
tokenizer adds it), a list of token ids, an OpenAI-style message list (chat
template applied, with the request's tools and template override from its
options; for multimodal models the model's own `process_prompt` runs the HF
processor), or a ready `MultiModalPrompt`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vlchat.llm.errors import InvalidRequestError, TextTooLongError
from vlchat.llm.tokenizer import apply_chat_template, json_strings, template_options


@dataclass(slots=True)
class ImageItem:
    """One image of a prompt.

    Args:
        hash: content hash of the pixels (mixed into prefix-cache block hashes).
        data: the processor outputs for this one image (pixel values, grid sizes...).
        offset: index in the prompt's token ids of its first placeholder token.
        length: number of placeholder tokens (= rows of its embedding).
    """

    hash: str
    data: dict[str, torch.Tensor]
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(slots=True)
class MultiModalPrompt:
    """Token ids plus, for multimodal models, the images whose placeholders they contain.

    `mrope_positions`: [3, len(token_ids)] int64 for M-RoPE models, else None;
    `mrope_delta`: added to the sequence position for tokens after the prompt.
    """

    token_ids: list[int]
    images: list[ImageItem] = field(default_factory=list)
    mrope_positions: torch.Tensor | None = None
    mrope_delta: int = 0
    text: str | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token or character")
        for item in self.images:
            if item.offset < 0 or item.end > len(self.token_ids):
                raise InvalidRequestError(
                    f"image placeholder span [{item.offset}, {item.end}) lies outside the prompt "
                    f"of {len(self.token_ids)} tokens"
                )
        if self.mrope_positions is not None and tuple(self.mrope_positions.shape) != (3, len(self.token_ids)):
            raise InvalidRequestError(
                f"mrope_positions must have shape (3, {len(self.token_ids)}), got {tuple(self.mrope_positions.shape)}"
            )


def _has_images(messages: list[Mapping]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            if any(isinstance(p, Mapping) and p.get("type") not in ("text", None) for p in content):
                return True
    return False


def _check_text(text: Any) -> None:
    """Refuse text the tokenizer cannot encode: unpaired UTF-16 surrogates (from JSON escapes or stdin)."""
    if not isinstance(text, str):
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"the text has an unpaired surrogate {text[e.start]!r} at character {e.start}, which is not valid "
            "Unicode; send UTF-8 text"
        ) from None


def _message_texts(messages: list[Mapping], tools: Any = None) -> list:
    """Every text the chat template may render: contents, tool calls in the history, the tools' definitions."""
    texts = []
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else [content]:
            texts.append(part.get("text") if isinstance(part, Mapping) else part)
        texts.extend(json_strings(message.get("tool_calls")))
    texts.extend(json_strings(tools))
    return texts


def _check_length(texts: list, max_chars: int | None, max_model_len: int | None) -> None:
    """Refuse text that cannot fit before tokenizing it (tokenizing tens of MB takes seconds and gigabytes)."""
    if max_chars is None:
        return
    num_chars = sum(len(t) for t in texts if isinstance(t, str))
    if num_chars > max_chars:
        raise TextTooLongError(num_chars, max_chars, max_model_len)


def max_prompt_chars(tokenizer, max_model_len: int, safety: int = 2) -> int | None:
    """Characters of text beyond which no prompt fits `max_model_len` tokens: the context times the longest
    vocabulary entry (a token never covers more characters than its entry spells: byte-level and byte-fallback
    entries spell one character or more per byte), times `safety` for normalizers that shorten text.
    None where the tokenizer does not list its vocabulary."""
    try:
        longest = max((len(piece) for piece in tokenizer.get_vocab()), default=0)
    except (AttributeError, TypeError, NotImplementedError):
        return None
    return max(1, longest) * max_model_len * safety if longest else None


def encode_text(
    tokenizer, text: str, max_chars: int | None = None, max_model_len: int | None = None, add_special_tokens=True
) -> list[int]:
    """The token ids of plain text; text longer than `max_chars` is refused before it is tokenized."""
    _check_length([text], max_chars, max_model_len)
    _check_text(text)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def normalize_prompt(
    prompt: Any,
    tokenizer,
    model_cls: type | None = None,
    processor=None,
    mm_options: Mapping | None = None,
    max_chars: int | None = None,
    max_model_len: int | None = None,
) -> MultiModalPrompt:
    """Turn `prompt` (str | list[int] | list[message dict] | MultiModalPrompt) into a `MultiModalPrompt`.

    `max_chars` (from `max_prompt_chars`): text longer than that is refused before it is tokenized.
    """
    if isinstance(prompt, MultiModalPrompt):
        return prompt
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("the prompt is empty; send at least one character")
        return MultiModalPrompt(token_ids=encode_text(tokenizer, prompt, max_chars, max_model_len), text=prompt)
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
        vocab = len(tokenizer) if tokenizer is not None else None
        if vocab is not None and any(t < 0 or t >= vocab for t in prompt):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {vocab}); got {min(prompt)}..{max(prompt)}")
        return MultiModalPrompt(token_ids=list(prompt))
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, Mapping) for m in prompt):
        for message in prompt:
            if "role" not in message or "content" not in message:
                raise InvalidRequestError("every chat message needs a 'role' and a 'content'")
        texts = _message_texts(prompt, (mm_options or {}).get("tools"))
        _check_length(texts, max_chars, max_model_len)
        for text in texts:
            _check_text(text)
        if getattr(model_cls, "is_multimodal", False):
            return model_cls.process_prompt(processor, list(prompt), dict(mm_options or {}))
        if _has_images(prompt):
            raise InvalidRequestError("this model reads text only; remove the image parts or serve a vision model")
        template = template_options(mm_options)
        return MultiModalPrompt(token_ids=apply_chat_template(tokenizer, list(prompt), **template))
    raise InvalidRequestError(
        "a prompt must be a string, a non-empty list of token ids, or a non-empty list of chat messages; "
        f"got {type(prompt).__name__}"
    )
