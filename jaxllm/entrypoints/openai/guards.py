"""RequestGuard: a plain ASGI middleware in front of the app that checks the API key and bounds the body size
before any route runs (plain ASGI, so streamed responses and disconnects pass straight through)."""

from __future__ import annotations

import hmac

from jaxllm.entrypoints.openai.errors import error_response

OPEN_PATHS = ("/health", "/ping", "/metrics", "/version")  # reachable without the API key (probes, scrapers)


class RequestGuard:
    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.expected is not None and route_path(scope) not in OPEN_PATHS and \
                not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            response = error_response(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                                      code="invalid_api_key")
            return await response(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_body_bytes:
                return await self._too_large(int(length), scope, receive, send)
            return await self.app(scope, receive, send)
        return await self._buffered(scope, receive, send)

    async def _buffered(self, scope, receive, send):
        """A body without Content-Length (chunked): read it up to the limit, then hand it on."""
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                return await self._too_large(None, scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, length: int | None, scope, receive, send):
        size = "" if length is None else f" has {length} bytes;"
        response = error_response(413, f"the request body{size} exceeds the limit of {self.max_body_bytes} bytes")
        return await response(scope, receive, send)


def route_path(scope) -> str:
    """The request's path as the routes see it: without the server's root path (--root-path) in front."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] or "/" if root and path.startswith(root) else path


class RootPath:
    """--root-path: a request under the prefix (a proxy's path) is routed as the path after it; one without the
    prefix as it is (vLLM answers both)."""

    def __init__(self, app, root_path: str):
        self.app = app
        self.root_path = root_path.rstrip("/")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(self.root_path + "/"):
            scope = {**scope, "root_path": scope.get("root_path", "") + self.root_path}
        return await self.app(scope, receive, send)

