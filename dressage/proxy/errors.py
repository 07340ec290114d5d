"""Errors -> OpenAI's error format, at one seam.

Every failure the proxy answers has the body ``{"error": {"message", "type", "param", "code"}}``
that OpenAI clients parse, and a 4xx status when the client can fix it. Messages are redacted
before they leave (they may quote request text). The mapping from the Dressage error tree:

=====================================  ======  ==========================  ============================
error                                  status  type                        code
=====================================  ======  ==========================  ============================
AuthError                              401     invalid_request_error       invalid_api_key
ConflictError                          409     invalid_request_error       its own code
RequestError                           400     invalid_request_error       its own code (or None)
PayloadTooLargeError                   413     invalid_request_error       request_too_large
ContextLengthExceededError             400     invalid_request_error       context_length_exceeded
TemplateError, TokenizationError       400     invalid_request_error       invalid_messages
EngineHTTPError 4xx                    400     invalid_request_error       engine_rejected
EngineError                            502     api_error                   engine_error
UnknownRunError, UnknownSessionError   404     invalid_request_error       not_found
InvalidRecordError                     400     invalid_request_error       invalid_record (param: the field)
IdempotencyConflictError               409     invalid_request_error       conflict
LeaseError                             409     invalid_request_error       lease_lost
StoreError (an outage)                 503     api_error                   store_unavailable
OverloadedError                        503     api_error                   overloaded
anything else                          500     api_error                   internal_error
=====================================  ======  ==========================  ============================

``overloaded`` (503, with ``Retry-After``): the proxy's admission queue was full or the request
waited in it too long (:mod:`dressage.proxy.admission`); nothing was recorded, a retry is served anew.

``turn_conflict`` (409): another proxy serving the same session recorded the turn first; nothing
was recorded for this request, and its retry is answered from the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from starlette.responses import JSONResponse

from dressage.errors import (
    AuthError,
    ConflictError,
    ContextLengthExceededError,
    DressageError,
    EngineError,
    EngineHTTPError,
    IdempotencyConflictError,
    InvalidRecordError,
    LeaseError,
    RequestError,
    StoreError,
    TemplateError,
    TokenizationError,
    UnknownRunError,
    UnknownSessionError,
)
from dressage.redact import redact

log = logging.getLogger("dressage.proxy")


class PayloadTooLargeError(RequestError):
    """The request body is larger than ``Settings.max_request_bytes`` (HTTP 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than {limit} bytes; send a shorter conversation "
            "or raise DRESSAGE_MAX_REQUEST_BYTES",
            code="request_too_large",
        )


class OverloadedError(DressageError):
    """The proxy refused a request under overload (HTTP 503 + ``Retry-After``); nothing was recorded."""

    def __init__(self, reason: str, retry_after: int) -> None:
        why = (
            "its admission queue is full"
            if reason == "queue_full"
            else "the request waited too long in its queue"
        )
        super().__init__(f"the proxy is overloaded ({why}); retry after {retry_after} s")
        self.reason = reason
        self.retry_after = retry_after


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def classify(exc: BaseException) -> tuple[int, str, str | None, str | None]:
    """(HTTP status, error type, param, code) for an exception (see the module table)."""
    if isinstance(exc, AuthError):
        return 401, "invalid_request_error", None, "invalid_api_key"
    if isinstance(exc, PayloadTooLargeError):
        return 413, "invalid_request_error", None, exc.code
    if isinstance(exc, ConflictError):
        return 409, "invalid_request_error", exc.param, exc.code
    if isinstance(exc, RequestError) and exc.code == "model_not_found":
        return 404, "invalid_request_error", exc.param, exc.code
    if isinstance(exc, RequestError):
        return 400, "invalid_request_error", exc.param, exc.code
    if isinstance(exc, ContextLengthExceededError):
        return 400, "invalid_request_error", "messages", "context_length_exceeded"
    if isinstance(exc, TemplateError | TokenizationError):
        return 400, "invalid_request_error", "messages", "invalid_messages"
    if isinstance(exc, EngineHTTPError) and 400 <= exc.status_code < 500:
        return 400, "invalid_request_error", None, "engine_rejected"
    if isinstance(exc, EngineError):
        return 502, "api_error", None, "engine_error"
    if isinstance(exc, UnknownRunError | UnknownSessionError):
        return 404, "invalid_request_error", None, "not_found"
    if isinstance(exc, InvalidRecordError):
        return 400, "invalid_request_error", exc.field, "invalid_record"
    if isinstance(exc, IdempotencyConflictError):
        return 409, "invalid_request_error", None, "conflict"
    if isinstance(exc, OverloadedError):
        return 503, "api_error", None, "overloaded"
    if isinstance(exc, LeaseError):
        return 409, "invalid_request_error", None, "lease_lost"
    if isinstance(exc, StoreError):
        return 503, "api_error", None, "store_unavailable"
    return 500, "api_error", None, "internal_error"


def error_message(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """The redacted message a client sees for ``exc``; server-side failures are logged here."""
    status, _, _, code = classify(exc)
    if isinstance(exc, DressageError):
        message = str(exc)
    else:
        message = f"internal error ({type(exc).__name__}); see the proxy log"
    if status >= 500 and not isinstance(exc, OverloadedError):  # refusals are counted, not logged
        log.error("proxy error %s: %s", code, redact(str(exc), secrets), exc_info=status == 500)
    return redact(message, secrets) or ""


def error_response(exc: BaseException, secrets: Iterable[str] = ()) -> JSONResponse:
    """The OpenAI-format JSON error response for ``exc``."""
    status, type_, param, code = classify(exc)
    return JSONResponse(error_body(error_message(exc, secrets), type_, param, code), status_code=status)


def http_error(status: int, message: str) -> JSONResponse:
    """An OpenAI-format body for plain HTTP errors (404 unknown route, 405 wrong method)."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, f"http_{status}")
    return JSONResponse(error_body(message, "invalid_request_error", None, code), status_code=status)
