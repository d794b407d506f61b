"""ServerLoad: how many generation requests the server is handling now, for GET /load (vLLM's
--enable-server-load-tracking). A request counts from its arrival until its response's last byte is sent (a
stream: until it ends or the client leaves)."""

from __future__ import annotations

from jaxllm.entrypoints.openai.guards import route_path

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/invocations"})


class ServerLoad:
    def __init__(self):
        self.count = 0  # requests to GENERATION_PATHS in flight (event loop only)


class CountGenerationRequests:
    """Plain ASGI middleware that keeps `load.count`."""

    def __init__(self, app, load: ServerLoad):
        self.app = app
        self.load = load

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or route_path(scope) not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        self.load.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.count -= 1
