"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} for every failure under /v1."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vlchat.app.errors import AppError, is_user_error, user_error_code, user_error_status
from vlchat.llm.errors import VLChatError

log = logging.getLogger("vlchat.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
}


def error_body(message: str, status: int, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(message: str, status: int, *, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(message, status, param=param, code=code), status_code=status, headers=headers)


def body_too_large(limit: int) -> JSONResponse:
    message = f"the request body is larger than the server's limit of {limit} bytes; send smaller images"
    return error_response(message, 413, code="request_too_large")


def user_error_response(exc: BaseException) -> JSONResponse:
    return error_response(
        getattr(exc, "message", None) or str(exc),
        user_error_status(exc),
        param=getattr(exc, "param", None),
        code=user_error_code(exc),
    )


def _field_path(loc) -> list[str]:
    """An error's location as request fields: without "body" and pydantic's union branch tags (str, list[...]).

    A tagged content part adds its tag before the field ("image_url", "image_url"); the repeat is dropped.
    """
    path = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and (p in _BRANCH_TAGS or "[" in p))]
    return [p for i, p in enumerate(path) if i == 0 or p != path[i - 1]]


_BRANCH_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is invalid", None
    if errors[0].get("type") == "json_invalid":
        return "the request body is not valid JSON; send a JSON object with Content-Type: application/json", None
    # A union field (content: str | list of parts) fails once per branch; the deepest failure is the specific one.
    depth = max(len(_field_path(e.get("loc", ()))) for e in errors)
    first = next(e for e in errors if len(_field_path(e.get("loc", ()))) == depth)
    loc = _field_path(first.get("loc", ()))
    same = [e for e in errors if _field_path(e.get("loc", ())) == loc]
    param = ".".join(loc) or None
    message = " or ".join(dict.fromkeys(e.get("msg", "invalid value").removeprefix("Value error, ") for e in same))
    if first.get("type") == "missing" and param:
        message = f"the field {param!r} is required"
    elif first.get("type") == "extra_forbidden" and param:
        message = f"the field {param!r} is not supported by this server; remove it (docs/API.md lists the fields)"
    elif param:
        message = f"{param}: {message}"
    return message, param


def install_error_handlers(app: FastAPI) -> None:
    async def on_validation(request: Request, exc: RequestValidationError):
        message, param = describe_validation_error(exc)
        return error_response(message, 400, param=param)

    async def on_http(request: Request, exc: StarletteHTTPException):
        if not request.url.path.startswith("/v1"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        if "vlchat.body_too_large" in request.scope:
            return body_too_large(request.scope["vlchat.body_too_large"])
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body could not be read: send UTF-8 encoded JSON"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /v1/models and POST /v1/chat/completions"
        return error_response(message, exc.status_code)

    async def on_any(request: Request, exc: Exception):
        if is_user_error(exc):
            return user_error_response(exc)
        log.exception("internal error on %s", request.url.path)
        return error_response("internal server error; the server log has the details", 500, code="internal_error")

    async def on_user_error(request: Request, exc: Exception):
        return user_error_response(exc)

    app.add_exception_handler(AppError, on_user_error)
    app.add_exception_handler(VLChatError, on_user_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_any)
