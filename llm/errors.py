"""Errors a user can cause. Each message says what to do; app/ maps them to HTTP status codes.

`http_status` is the status the API answers with for that error.
"""

from __future__ import annotations


class VLChatError(Exception):
    """Base class of every error a user of vlchat can cause."""

    http_status: int = 500


class InvalidRequestError(VLChatError, ValueError):
    """The request itself is malformed (bad sampling parameter, bad message, empty prompt...)."""

    http_status = 400


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit into the model's context length."""

    def __init__(self, prompt_len: int, max_model_len: int, max_tokens: int | None = None) -> None:
        self.prompt_len = prompt_len
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens
        wanted = f"{prompt_len} prompt tokens" + (f" + {max_tokens} max_tokens" if max_tokens else "")
        super().__init__(
            f"{wanted} exceed the model's context length of {max_model_len} tokens; "
            "shorten the conversation or lower max_tokens"
        )


class RequestFailedError(VLChatError, RuntimeError):
    """The engine failed while generating this request; the other requests go on. The server log has the cause."""

    http_status = 500

    def __init__(self, request_id: str, cause: BaseException) -> None:
        self.request_id = request_id
        self.cause = cause
        super().__init__(
            f"the engine failed while generating request {request_id} ({type(cause).__name__}: {cause}); "
            "other requests are not affected. Retry it, or report it with the server log if it fails again"
        )


class TextTooLongError(InvalidRequestError):
    """The prompt's text is too long to fit the context whatever it tokenizes to (found before tokenizing it)."""

    code = "context_length_exceeded"

    def __init__(self, num_chars: int, max_chars: int, max_model_len: int) -> None:
        self.num_chars, self.max_chars, self.max_model_len = num_chars, max_chars, max_model_len
        super().__init__(
            f"the prompt has {num_chars} characters of text; no text over {max_chars} characters fits the model's "
            f"context of {max_model_len} tokens. Shorten the conversation"
        )


class ModelLoadError(VLChatError):
    """A model directory cannot be loaded (missing files, unreadable config, bad weights)."""

    http_status = 500


class UnsupportedModelError(ModelLoadError):
    """The model's architecture (or a feature of it, e.g. its activation) is not one vlchat implements."""

    def __init__(self, what: str, supported: list[str]) -> None:
        self.what = what
        self.supported = supported
        super().__init__(f"{what} is not supported; supported: {', '.join(sorted(supported))}")


class WeightMismatchError(ModelLoadError):
    """The checkpoint's tensors do not match the model's parameters."""

    def __init__(
        self,
        missing: list[str],
        unexpected: list[str],
        shape_mismatch: list[str] | None = None,
        where: str = "",
    ) -> None:
        self.missing = sorted(missing)
        self.unexpected = sorted(unexpected)
        self.shape_mismatch = sorted(shape_mismatch or [])
        parts = []
        if self.missing:
            parts.append(f"missing parameters (not in the checkpoint): {_preview(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected tensors (no matching parameter): {_preview(self.unexpected)}")
        if self.shape_mismatch:
            parts.append(f"shape mismatches: {_preview(self.shape_mismatch)}")
        location = f" in {where}" if where else ""
        super().__init__(
            f"the checkpoint{location} does not match the model: "
            + "; ".join(parts)
            + ". Check that config.json belongs to these weights and that the architecture is right."
        )


class TensorParallelError(ModelLoadError):
    """The model cannot be split over the requested ranks (heads, vocabulary or MLP width not divisible)."""


class WorkerDiedError(VLChatError):
    """A tensor-parallel worker process exited or failed; the engine has stopped and must be restarted."""

    http_status = 503

    def __init__(self, rank: int, detail: str) -> None:
        self.rank = rank
        super().__init__(
            f"tensor-parallel worker rank {rank} stopped ({detail}); the engine has shut down its workers: "
            "restart the server (see the worker's log above for the cause)"
        )


class EngineOverloadedError(VLChatError):
    """The engine cannot accept more requests right now; retry later."""

    http_status = 503


def _preview(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")
