"""The OpenAI request bodies, validated strictly (wrong types are 400s, not coerced; a field the server does not
implement is a 400 naming it, never ignored)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


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


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages: the calls it made
    tool_call_id: str | None = None  # tool messages: the call this is the result of

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
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if isinstance(self.content, list) and self.role != "user":
            if any(isinstance(part, ImagePart) for part in self.content):
                raise ValueError("images may only appear in user messages")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # an extension (as in vLLM): every chunk carries the usage so far


# Entries of logit_bias and stop_token_ids at most: the sampler reads them for every token of the request
MAX_TOKEN_ID_FIELDS = 300

# OpenAI chat fields this server does not implement, with the values that ask for nothing (accepted and dropped);
# any other value is a 400 naming the field, never silently ignored.
UNSUPPORTED_FIELDS = {
    "functions": ([],),
    "function_call": ("none",),
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


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs {"json_schema": {"name": ..., "schema": {...}}}')
        return self


class StructuredOutputs(_Strict):
    """The extension (as in vLLM): exactly one of a regex, a list of choices, a JSON schema or a Lark grammar."""

    regex: str | None = None
    choice: list[str] | None = None
    json_: dict | None = Field(default=None, alias="json")
    grammar: str | None = None


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class SamplingFields(_Request):
    """The sampling fields chat and text completions share; top_k, min_p, repetition_penalty, ignore_eos,
    min_tokens, stop_token_ids and structured_outputs are extensions (as in vLLM)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_TOKEN_ID_FIELDS)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_TOKEN_ID_FIELDS)
    structured_outputs: StructuredOutputs | None = None
    user: str | None = None  # an end-user id (OpenAI uses it for abuse monitoring); no effect on the answer

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids as strings, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must lie in [-100, 100], got {bias} for token {key}")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value):
        if any(t < 0 for t in value or []):
            raise ValueError("stop_token_ids must be non-negative token ids")
        return value

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


class ChatCompletionRequest(SamplingFields):
    """Standard chat-completions fields, the extensions of SamplingFields, and mm_processor_kwargs (vLLM's name)."""

    @model_validator(mode="before")
    @classmethod
    def _no_silent_no_ops(cls, data):
        if isinstance(data, dict) and any(name in data for name in UNSUPPORTED_FIELDS):
            data = dict(data)
            for name, neutral in UNSUPPORTED_FIELDS.items():
                value = data.pop(name, None)
                if value is not None and not any(type(value) is type(n) and value == n for n in neutral):
                    raise ValueError(f"{name} is not supported by this server yet; remove it from the request")
        return data

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    mm_processor_kwargs: ProcessorKwargs | None = None

    @model_validator(mode="after")
    def _field_pairs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools {names}")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    """The legacy text-completions body: a prompt string, token ids, or a batch of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    response_format: ResponseFormat | None = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value):
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("the prompt must not be empty")
        if isinstance(value, list) and any(isinstance(p, int) and p < 0 for p in value):
            raise ValueError("prompt token ids must be non-negative")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        return [p] if p and isinstance(p[0], int) else list(p)


class TokenizeRequest(_Request):
    """Either a prompt (text) or messages (rendered by the chat template, as a chat request would be)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None  # rendered by the chat template, as a chat request with these tools would be
    add_special_tokens: bool = True  # prompt only: the tokenizer's BOS and the like

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt or messages")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools go with messages")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
