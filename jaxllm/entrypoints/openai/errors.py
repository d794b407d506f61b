"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from jaxllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from jaxllm.errors import printable

logger = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code, self.headers)


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = ErrorResponse(error=ErrorInfo(message=printable(message), type=kind,
                                         param=None if param is None else printable(param), code=code or status))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param)


class UnexpectedErrorsAsOpenAIErrors:
    """ASGI middleware: an exception no handler took becomes a 500 in the OpenAI error shape, logged with its
    traceback. It is answered here rather than re-raised (as Starlette's last-resort handler does), so the server
    does not close the client's keep-alive connection. A response already started (a stream) cannot change
    status: its failure is re-raised."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as e:  # noqa: BLE001 - the point of this middleware
            if started:
                raise
            logger.exception("%s %s failed", scope.get("method"), scope.get("path"))
            response = error_response(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            await response(scope, receive, send)
