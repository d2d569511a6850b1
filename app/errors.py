"""Errors a user of the app can cause, and how each maps to an HTTP status."""

from __future__ import annotations


class AppError(Exception):
    """A request the app refuses; the message says what to do instead."""

    status = 400
    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class ConfigError(AppError):
    """A bad command-line option or setting."""


class MediaError(AppError):
    """An image that cannot be used: unreadable, too large, or from a place the server may not read."""

    code = "invalid_image"


class ForbiddenMediaError(MediaError):
    status = 403
    error_type = "permission_error"
    code = "media_not_allowed"


class AuthError(AppError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFoundError(AppError):
    status = 404
    error_type = "not_found_error"
    code = "model_not_found"


class PayloadTooLargeError(AppError):
    status = 413
    code = "request_too_large"


def is_user_error(exc: BaseException) -> bool:
    """True for errors whose message is meant for the user (shown as-is, never with a traceback)."""
    from vlchat.llm.errors import VLChatError  # imported here so that `vlchat --help` does not load the engine

    return isinstance(exc, (AppError, VLChatError))


def user_error_status(exc: BaseException) -> int:
    if isinstance(exc, AppError):
        return exc.status
    return getattr(exc, "http_status", 400)


def user_error_code(exc: BaseException) -> str | None:
    if isinstance(exc, AppError):
        return exc.code
    from vlchat.llm.errors import PromptTooLongError

    if isinstance(exc, PromptTooLongError):
        return "context_length_exceeded"
    return getattr(exc, "code", None)
