"""HEAD on every GET route: RFC 9110 §9.3.2 asks a server to answer HEAD as it answers GET, without the body.

FastAPI's ``@app.get`` routes accept GET only, so ``HEAD /healthz`` (what load balancers, uptime checkers
and ``curl -I`` send) got 405. This ASGI wrapper runs a HEAD request as a GET through the whole app (the
token check included) and drops the body, keeping the status and the headers (Content-Length included:
it is the length a GET would return).
"""

from __future__ import annotations

from typing import Any

Scope = dict[str, Any]


class HeadAsGet:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        done = False

        async def send_headers_only(message: dict[str, Any]) -> None:
            nonlocal done
            if message["type"] == "http.response.body":
                if done:
                    return
                done = not message.get("more_body", False)
                if done:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)
