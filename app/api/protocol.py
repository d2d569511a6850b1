"""The OpenAI chat-completions request body, validated strictly (wrong types are 400s, not coerced)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ImageURL(_Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _known_part_types(cls, value):
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "image_url"):
                    raise ValueError(f"content part {i} has type {kind!r}; the types are 'text' and 'image_url'")
        return value

    @model_validator(mode="after")
    def _content_rules(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if isinstance(self.content, list) and self.role != "user":
            if any(isinstance(part, ImagePart) for part in self.content):
                raise ValueError("images may only appear in user messages")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # an extension (as in vLLM): every chunk carries the usage so far


# OpenAI fields this server does not implement yet, with the values that ask for nothing (accepted); any other
# value is a 400 naming the field, never silently ignored.
UNSUPPORTED_FIELDS = {
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (False,),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
}


class ProcessorKwargs(_Strict):
    """Per-request image budget for processors that size images by pixel count (Qwen2-VL, Qwen2.5-VL)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    min_pixels: int | None = Field(default=None, ge=1)
    max_pixels: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
        return self


class ChatCompletionRequest(_Strict):
    """Standard fields plus the extras top_k, min_p, repetition_penalty, ignore_eos and mm_processor_kwargs."""

    @model_validator(mode="before")
    @classmethod
    def _no_silent_no_ops(cls, data):
        if isinstance(data, dict):
            for name, neutral in UNSUPPORTED_FIELDS.items():
                value = data.get(name)
                if value is not None and not any(type(value) is type(n) and value == n for n in neutral):
                    raise ValueError(f"{name} is not supported by this server yet; remove it from the request")
        return data

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    user: str | None = None
    mm_processor_kwargs: ProcessorKwargs | None = None  # vLLM's name

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        strings = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
