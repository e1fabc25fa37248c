"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker.protocol.limits import LimitError
from worker.protocol.openai_batch import error_object
from worker.protocol.sampling_params import InvalidRequestError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered to the client with ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra = extra  # fields of the error object beyond OpenAI's four
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _type_for(status)
        self.headers = headers


def _type_for(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


def _shown(object_id: str) -> str:
    return object_id if len(object_id) <= 80 else object_id[:77] + "..."


def not_found(kind: str, object_id: str, *, param: str = "id") -> ApiError:
    """The 404 for an id that does not exist or belongs to another tenant."""
    return ApiError(404, f"No {kind} with id {_shown(object_id)!r}", code="not_found", param=param)


def model_not_found(model_id: str, hint: str = "") -> ApiError:
    """The 404 for a model no live worker serves (OpenAI's code, ``model_not_found``);
    ``hint`` ends the message."""
    return ApiError(
        404,
        f"The model {_shown(model_id)!r} does not exist or no live worker serves it{hint}",
        code="model_not_found",
        param="model",
    )


def idempotency_key_reused(key: str, *, param: str) -> ApiError:
    """409: ``key`` already created something from a different request."""
    return ApiError(
        409,
        f"idempotency key {key!r} was already used with a different request",
        code="idempotency_key_reused",
        param=param,
    )


def known_id(kind: str, object_id: str, *, param: str = "id") -> str:
    """``object_id`` when it could name a stored object (1-64 printable characters);
    else the 404 at once, before it reaches SQL."""
    if not 0 < len(object_id) <= 64 or not object_id.isprintable() or not object_id.isascii():
        raise not_found(kind, object_id, param=param)
    return object_id


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    """A JSONResponse carrying an OpenAI error object (with ``extra`` fields, if any)."""
    error = error_object(message, code=code, param=param, type=type or _type_for(status))
    body = {"error": {**error, **(extra or {})}}
    return JSONResponse(body, status_code=status, headers=headers)


def _limit_error(exc: RequestValidationError) -> LimitError | None:
    """The LimitError a body's validator raised (``api.schemas.StoredBody``), if that is
    what failed: answered with its own message, code and param."""
    errors: list[Any] = list(exc.errors())
    cause = (errors[0].get("ctx") or {}).get("error") if errors else None
    return cause if isinstance(cause, LimitError) else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors: list[Any] = list(exc.errors())
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
        where = [p for p in first.get("loc", ()) if isinstance(p, int)]
        at = f" at character {where[0]}" if where else ""
        return f"malformed JSON body{at}", None
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    return (f"{param}: {msg}" if param else msg), param


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to the OpenAI shape (unexpected ones to a 500 without details)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(
            exc.status,
            exc.message,
            code=exc.code,
            param=exc.param,
            type=exc.type,
            headers=exc.headers,
            extra=exc.extra,
        )

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(
            400,
            str(exc),
            code=getattr(exc, "code", "invalid_request"),
            param=getattr(exc, "param", None),
        )

    @app.exception_handler(LimitError)
    async def _limit(_: Request, exc: LimitError) -> JSONResponse:
        return error_response(400, str(exc), code=exc.code, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        limit = _limit_error(exc)
        if limit is not None:
            return error_response(400, str(limit), code=limit.code, param=limit.param)
        message, param = _validation_message(exc)
        return error_response(400, message, code="invalid_request", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(
            exc.status_code,
            str(exc.detail),
            code=_HTTP_CODES.get(exc.status_code),
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(DataError)
    async def _data(request: Request, exc: DataError) -> JSONResponse:
        # The database's own text names internals (and may quote the value): not sent.
        log.warning(
            "store refused a value on %s %s: %s",
            request.method,
            request.url.path,
            type(getattr(exc, "orig", exc)).__name__,
        )
        return error_response(
            400, "a value in the request cannot be stored", code="invalid_value"
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(
            500, "internal server error; the request was logged", code="internal_error"
        )
