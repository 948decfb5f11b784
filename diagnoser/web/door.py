"""serve's front door: what a connection may cost before the app sees a request.

Uvicorn's own options bound an idle kept-alive connection (``timeout_keep_alive``) and the size of an
unfinished request head (``h11_max_incomplete_event_size``), but not the time a client takes to send
it: a client that sends one header byte every few seconds (slowloris) holds its connection, and its
file descriptor, for ever. At the usual limit of 1,024 open files, 1,100 such clients starve ``accept()``
and every request — ``/healthz`` included — times out while asyncio logs a traceback per failed accept.

:class:`Door` adds, on uvicorn's own h11 protocol (:func:`protocol`):

* a **head deadline** (``HEAD_TIMEOUT_S``): the request line and headers must be in within it, from
  the connection's start or the end of the previous answer on a kept-alive one; then it is closed;
* a **request deadline** (``REQUEST_TIMEOUT_S``): from the complete head to the answer sent (a body
  trickled slowly, an app that never answers);
* a **cap on connections** (``max_connections``, below the open-file limit with room for the
  poller's own sockets): a connection over the cap closes the oldest connection still waiting for its
  head (the slowloris ones) and takes its place, so a client that sends its request at once — a health
  check — is served however many half-open connections there are; when every connection is busy with a
  request, the newcomer gets ``503`` and is closed;
* a quiet **accept error** handler: ``accept()`` failing for lack of file descriptors is one log line a
  minute with the count, not a traceback each time.

The Host check (DNS rebinding) is :class:`HostCheck`, a plain ASGI wrapper.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5  # uvicorn's timeout_keep_alive: an idle kept-alive connection is closed after this
MAX_HEAD_BYTES = 16 * 1024  # uvicorn's h11_max_incomplete_event_size: the most a request head may hold
RESERVED_FDS = 64  # files the process needs besides the connections (poller sockets, logs, the loop, stdio)
# the listen backlog, and the connections asyncio accepts in one loop turn before their protocols run
# and the cap can close any: kept free under the file limit. Should a burst still find no file left,
# accepting pauses ACCEPT_RETRY_S (asyncio's own pause is 1 s: every health check in it would time out).
BACKLOG = 256
ACCEPT_RETRY_S = 0.05
_LOG = logging.getLogger("diagnoser.serve")
_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 47\r\nConnection: close\r\n\r\n"
            b"Too many connections to diagnose serve; retry.\n")


def quick_accept_retry() -> None:
    """asyncio waits ``constants.ACCEPT_RETRY_DELAY`` (1 s) after accept() fails for lack of files; serve
    retries sooner (called in serve's own process only)."""
    import asyncio.constants

    asyncio.constants.ACCEPT_RETRY_DELAY = ACCEPT_RETRY_S  # type: ignore[misc]


def default_max_connections(targets: int = 0) -> int:
    """The connection cap from the open-file limit: what is left after the process's own files."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(8, min(soft, 65536) - RESERVED_FDS - BACKLOG - 2 * targets)


class Door:
    """The shared state of every connection: those waiting for their request head, oldest first, and all."""

    def __init__(self, max_connections: int, head_timeout: float = HEAD_TIMEOUT_S, request_timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.max_connections = max(1, int(max_connections))
        self.head_timeout = head_timeout
        self.request_timeout = request_timeout
        self.open: set[Any] = set()
        self.waiting: OrderedDict[Any, None] = OrderedDict()
        self.evicted = 0  # waiting connections closed to make room
        self.refused = 0  # newcomers refused (every connection busy)
        self.timed_out = 0  # closed at a deadline
        self.accept_errors = 0
        self._said_at = 0.0

    def admit(self, conn: Any) -> bool:
        """Register a new connection; False when it must be refused (the caller closes it)."""
        self.open.add(conn)
        self.waiting[conn] = None
        while len(self.open) > self.max_connections:
            victim = next((c for c in self.waiting if c is not conn), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            victim.close_now()
        return True

    def forget(self, conn: Any) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: accept() out of file descriptors is counted and said once a
        minute; anything else goes to asyncio's default handler."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (23, 24, 105, 12):  # ENFILE, EMFILE, ENOBUFS, ENOMEM
            self.accept_errors += 1
            now = time.monotonic()
            if now - self._said_at >= 60.0:
                self._said_at = now
                _LOG.warning("diagnose serve: cannot accept connections: %s (%d time(s) so far); existing ones are served "
                             "and the cap is %d connections.", exc.strerror or exc, self.accept_errors, self.max_connections)
            return
        loop.default_exception_handler(context)


def protocol(door: Door) -> type[H11Protocol]:
    """Uvicorn's h11 protocol with the door's deadlines and cap (pass as ``uvicorn.Config(http=…)``)."""

    class GuardedH11(H11Protocol):
        _door_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not door.admit(self):
                try:
                    transport.write(_REFUSED)
                finally:
                    transport.close()
                return
            self._door_arm(door.head_timeout)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self in door.waiting and self.cycle is not None and not self.cycle.response_complete:
                door.waiting.pop(self, None)  # the head is in: the request's own deadline now
                self._door_arm(door.request_timeout)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                door.waiting.pop(self, None)  # a pipelined request was in already (uvicorn started it): its deadline
                self._door_arm(door.request_timeout)
            else:
                door.waiting[self] = None  # kept alive: the next head has its deadline too
                door.waiting.move_to_end(self)
                self._door_arm(door.head_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            door.forget(self)
            if self._door_timer is not None:
                self._door_timer.cancel()
                self._door_timer = None
            super().connection_lost(exc)

        def _door_arm(self, seconds: float) -> None:
            if self._door_timer is not None:
                self._door_timer.cancel()
            self._door_timer = self.loop.call_later(seconds, self._door_expired)

        def _door_expired(self) -> None:
            self._door_timer = None
            door.timed_out += 1
            self.close_now()

        def close_now(self) -> None:
            door.forget(self)
            if not self.transport.is_closing():
                self.transport.abort()  # no lingering close: the file descriptor is freed now

    return GuardedH11


# -- the Host check ------------------------------------------------------------------------------
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def host_of(header: bytes) -> str:
    """``b"Example.COM:8000"`` → ``"example.com"``; ``b"[::1]:8000"`` → ``"::1"``."""
    h = header.decode("latin-1").strip().lower()
    if h.startswith("["):
        return h[1:].split("]", 1)[0]
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True


class HostCheck:
    """Refuses (``421``) a request whose ``Host`` is not one of this server's names: the loopback names,
    the bound address and ``--allow-host`` names (``*`` allows any). Bound to every address (``0.0.0.0``),
    any address literal is this server's too. A page on another site that points its own name at
    127.0.0.1 (DNS rebinding) sends that name, and is refused."""

    def __init__(self, app: Any, bound: str, allow: list[str] | tuple[str, ...] = ()) -> None:
        self.app = app
        names = {host_of(a.encode("latin-1", "replace")) for a in allow if a.strip()}
        self.any = "*" in names
        self.wildcard = bound.strip().lower() in _WILDCARDS
        self.names = LOOPBACK_NAMES | {host_of(bound.encode("latin-1", "replace"))} | names

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    def allowed(self, header: bytes | None) -> bool:
        if self.any:
            return True
        if not header:
            return False
        h = host_of(header)
        return h in self.names or (self.wildcard and _is_ip(h))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.any:
            host = next((v for k, v in scope.get("headers") or [] if k == b"host"), None)
            if not self.allowed(host):
                body = (b"Misdirected request: this diagnose serve does not answer for that Host. "
                        b"Open it by its address (127.0.0.1), or start it with --allow-host NAME.\n")
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                                        (b"x-content-type-options", b"nosniff")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


__all__ = ["KEEP_ALIVE_S", "MAX_HEAD_BYTES", "Door", "HostCheck", "default_max_connections", "host_of", "protocol"]
