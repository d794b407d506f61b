"""RequestIdHeader: every response carries an X-Request-Id header, the client's own when it sent one (vLLM's
request-id headers); the client's id also names a completion or chat response (`cmpl-<id>`), as in vLLM."""

from __future__ import annotations

import uuid

HEADER = b"x-request-id"


class RequestIdHeader:
    """Plain ASGI middleware: the client's X-Request-Id (or a new one) on the response; the client's value, or
    None, in the request's state as `client_request_id`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client_id = dict(scope["headers"]).get(HEADER)
        scope.setdefault("state", {})["client_request_id"] = None if client_id is None else client_id.decode("latin-1")
        header = client_id if client_id is not None else uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, header)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
