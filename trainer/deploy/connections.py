"""Client connections the server keeps open: read timeouts, a connection limit, and the listening socket's backlog.

uvicorn closes an idle kept-alive connection (``timeout_keep_alive``) but never
one that sends its request slowly: 1,100 clients trickling header bytes hold
1,100 file descriptors, and under the usual soft limit of 1,024 every other
client then gets "Too many open files". :class:`GuardedH11Protocol` (uvicorn's
h11 protocol, one class per server from :func:`guarded_protocol`) adds:

- a header timeout: a request's line and headers must arrive within
  ``header_timeout`` s of the connection (or of the previous answer on a kept-alive one);
- a body timeout: its body within ``body_timeout`` s of its headers;
- a connection limit: at ``max_connections`` open, a new connection closes
  the oldest one still waiting for its headers (slow or idle: it has cost the
  server nothing yet; one younger than a second may just not have been read
  yet and is spared), else it is refused with 503 itself.

A closed slow client gets ``408 Request Timeout``. One sweep per
``SWEEP`` s checks every connection; ``ptrain_serve_connections_closed_total``
counts them by reason.

:func:`refuse_backlog` answers 503 to the connections the kernel completed but
the server has not accepted yet, before the listening socket closes at the
end of a drain (closing it would reset them).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from typing import Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

SWEEP = 0.25  # s between checks of every connection's clock
TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
               b"content-length: %d\r\n\r\n%s")
REFUSED_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
               b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _raw(template: bytes, line: str) -> bytes:
    body = ('{"error": "%s"}' % line).encode()
    return template % (len(body), body)


class Guard:
    """The limits and the open connections of one server (shared by its protocol instances)."""

    def __init__(self, header_timeout: float, body_timeout: float, max_connections: int, metrics=None):
        self.header_timeout, self.body_timeout = header_timeout, body_timeout
        self.max_connections = max_connections
        self.metrics = metrics
        self.open: "collections.OrderedDict[GuardedH11Protocol, None]" = collections.OrderedDict()
        self.closed = collections.Counter()
        self._sweeper: Optional[asyncio.TimerHandle] = None

    def count(self, reason: str) -> None:
        self.closed[reason] += 1
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()

    def added(self, conn: "GuardedH11Protocol") -> bool:
        """Register ``conn``; False when it must be refused (the limit is reached and nobody can be evicted)."""
        if len(self.open) >= self.max_connections:
            now, grace = time.monotonic(), min(1.0, self.header_timeout / 4)  # a new client's bytes may be unread yet
            victim = next((c for c in self.open if c.waiting_for_headers() and now - c.since > grace), None)
            if victim is None:
                return False
            self.count("limit")
            victim.close_with(TIMEOUT_408, "the server is at its connection limit and your request had not "
                                            "arrived: send the request at once after connecting")
        self.open[conn] = None
        self._gauge()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self.sweep)
        return True

    def removed(self, conn: "GuardedH11Protocol") -> None:
        self.open.pop(conn, None)
        self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.connections.set(len(self.open))

    def sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.open):
            conn.check(now)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self.sweep) if self.open else None


def guarded_protocol(guard: Guard) -> type:
    """uvicorn's ``http=`` class for a server with ``guard``'s limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


class GuardedH11Protocol(H11Protocol):
    guard: Guard

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.since = time.monotonic()      # start of the current phase (headers, or body)
        self.phase = "headers"
        if not self.guard.added(self):
            self.guard.count("refused")
            self.close_with(REFUSED_503, f"the server holds its limit of {self.guard.max_connections} connections "
                                         "(--max_connections): retry")

    def connection_lost(self, exc) -> None:
        self.guard.removed(self)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY and self.phase == "headers":
            self.phase, self.since = "body", time.monotonic()
        elif state is not h11.SEND_BODY and state is not h11.IDLE:
            self.phase = "request"        # read whole: the answer is the app's business

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.phase, self.since = "headers", time.monotonic()

    def waiting_for_headers(self) -> bool:
        return self.phase == "headers" and self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def check(self, now: float) -> None:
        if self.transport.is_closing():
            return
        if self.waiting_for_headers() and now - self.since > self.guard.header_timeout:
            self.guard.count("header_timeout")
            self.close_with(TIMEOUT_408, f"the request line and headers did not arrive within "
                                         f"{self.guard.header_timeout:g} s (--header_timeout)")
        elif self.phase == "body" and self.conn.their_state is h11.SEND_BODY \
                and now - self.since > self.guard.body_timeout:
            self.guard.count("body_timeout")
            self.close_with(TIMEOUT_408, f"the request body did not arrive within {self.guard.body_timeout:g} s "
                                         "(--body_timeout)")

    def data_received(self, data: bytes) -> None:
        if getattr(self, "lingering", False):
            return  # answered and half-closed: read what the client still sends, so closing sends no reset
        super().data_received(data)

    def refuse_and_linger(self, line: str, linger: float = 0.3) -> None:
        """Answer 503 ``line``, half-close, and close after ``linger`` s (the client's bytes are read meanwhile)."""
        self.lingering = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        try:
            self.transport.write(_raw(REFUSED_503, line))
            if self.transport.can_write_eof():
                self.transport.write_eof()
        except (OSError, RuntimeError):
            pass
        self.loop.call_later(linger, self.transport.close)

    def close_with(self, template: bytes, line: str) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        try:
            self.transport.write(_raw(template, line))
        finally:
            self.transport.close()


def refuse_backlog(sock: socket.socket, line: str, budget: float = 0.5) -> int:
    """Answer 503 ``line`` (Connection: close) to the connections waiting in ``sock``'s backlog, for at most
    ``budget`` seconds (clients that keep connecting cannot hold the shutdown); the count answered."""
    answered, deadline = 0, time.monotonic() + budget
    try:
        sock.listen(0)  # from here new connection attempts wait in the client's retries, then are refused
    except OSError:
        pass
    sock.setblocking(False)
    while time.monotonic() < deadline:
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, OSError):
            return answered
        try:
            conn.settimeout(0.02)
            try:  # read what the client sent, so closing does not reset the connection under our answer
                conn.recv(65536)
            except OSError:
                pass
            conn.sendall(_raw(REFUSED_503, line))
            conn.shutdown(socket.SHUT_WR)
            _linger(conn, deadline)
        except OSError:
            pass
        finally:
            conn.close()
            answered += 1
    return answered


def _linger(conn: socket.socket, deadline: float) -> None:
    """Read until the client closes (it does, after our ``Connection: close`` answer) or ``deadline``: a request
    that reaches a closed socket makes the kernel reset the connection, and a client then sees the reset instead of
    the 503 (a busy machine delays the client's request past the first read)."""
    while time.monotonic() < deadline:
        conn.settimeout(max(0.001, min(0.1, deadline - time.monotonic())))
        try:
            if not conn.recv(65536):
                return
        except socket.timeout:
            continue
        except OSError:
            return
