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
  yet and is spared), else it is refused with 503 itself;
- framing read one way: a request with both ``Content-Length`` and
  ``Transfer-Encoding`` is answered 400 and its connection closed
  (:mod:`~trainer.deploy.framing`: no request smuggling);
- one write per answer: its status line, headers and first body part leave in
  one ``send()`` (:class:`OneWrite`). uvicorn writes the head and the body apart,
  two segments that each wake the client: on a digits request the second write
  cost 2-6% of the requests/s a client gets alone.

A closed slow client gets ``408 Request Timeout``. One sweep per ``SWEEP`` s
checks every connection; ``ptrain_serve_connections_closed_total`` counts them
by reason.

:func:`refuse_backlog` takes the connections the kernel completed but the
server has not accepted yet, before the listening socket closes at the end of
a drain (closing it would reset them), and seals the backlog so that no
connection completes between the last one taken and the close; the ones taken
are answered 503 once it is closed and read until their clients close them
(:class:`Lingering`), so that none is reset under its answer.
"""

from __future__ import annotations

import asyncio
import collections
import os
import selectors
import socket
import threading
import time
from typing import List, Optional, Tuple

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .framing import BAD_400, FramedConnection

SWEEP = 0.25  # s between checks of every connection's clock
SEAL_TRIES = 20  # attempts to seal the backlog at the end of a drain (one fails only when a client got in first)
LINGER = 1.0  # s an answered connection of the backlog is read for its client's request and close
SEAL_BACKLOG = 8  # the backlog while the drain ends: room for this many half-open connections before SYN cookies
_TABLES = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}
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
        self.requests = 0  # requests read and not yet answered, over every connection (the batcher's load signal)
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
    _counted = None  # the request cycle counted in guard.requests, until it is answered

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size  # as uvicorn's own connection, refusing ambiguous framing
        self.conn = FramedConnection(h11.SERVER) if size is None else FramedConnection(h11.SERVER, size)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read; a request refused for its framing gets its own line."""
        if self.conn.refused is None:
            super().send_400_response(msg)
            return
        self.guard.count("framing")
        self.refuse_and_linger(self.conn.refused, BAD_400)  # its body may still be arriving: no reset under the 400

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
        self._answered()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._counted and not self.cycle.response_complete:
            self._counted = self.cycle  # read in this turn of the loop: counted before any handler runs
            self.guard.requests += 1
            self.cycle.transport = OneWrite(self.transport, self.conn)  # a new cycle: uvicorn gave it ours
        state = self.conn.their_state
        if state is h11.SEND_BODY and self.phase == "headers":
            self.phase, self.since = "body", time.monotonic()
        elif state is not h11.SEND_BODY and state is not h11.IDLE:
            self.phase = "request"        # read whole: the answer is the app's business

    def on_response_complete(self) -> None:
        if self.cycle is not None and isinstance(self.cycle.transport, OneWrite):
            self.cycle.transport.flush()
        self._answered()
        super().on_response_complete()
        self.phase, self.since = "headers", time.monotonic()

    def _answered(self) -> None:
        if self._counted is not None:
            self._counted = None
            self.guard.requests -= 1

    def waiting_for_headers(self) -> bool:
        return self.phase == "headers" and self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def check(self, now: float) -> None:
        if self.transport.is_closing() or getattr(self, "lingering", False):
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

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown closes every connection without a request at once: one answered 503 and
        lingering (:meth:`refuse_and_linger`) is left to its linger, else a request already on its way would
        reach a closed socket and the client would read a reset instead of the 503."""
        if not getattr(self, "lingering", False):
            super().shutdown()

    def refuse_and_linger(self, line: str, template: bytes = REFUSED_503, linger: float = LINGER) -> None:
        """Answer 503 ``line`` (or ``template``'s status), half-close, and close when the client closes (asyncio
        closes the transport at its
        EOF) or after ``linger`` s; the client's bytes are read and dropped meanwhile."""
        self.lingering = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        try:
            self.transport.write(_raw(template, line))
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


def refuse_backlog(sock: socket.socket, line: str, budget: float = 0.5) -> Tuple[List[socket.socket], "Lingering"]:
    """Take the connections waiting in ``sock``'s backlog (for at most ``budget`` seconds: clients that keep
    connecting cannot hold the shutdown), then seal the backlog: ``(the seal's connections, the connections
    taken)``. Close ``sock`` next and the seal after it, then answer the ones taken with 503 ``line``
    (:meth:`Lingering.answer`).

    Closing a listening socket resets every connection the kernel completed but the server did not accept (a
    client then reads ECONNRESET instead of an answer), and clients keep connecting until it closes. So the
    backlog is cut to ``SEAL_BACKLOG`` connections and, once it is empty, filled with connections of our own
    (the seal): while it is full the kernel drops new connection attempts (the client's SYN is retried a second
    later and then refused, as for a stopped server) instead of completing them. The backlog is not cut to 0:
    Linux then answers every connection attempt with a SYN cookie, which leaves no trace, and a client whose
    handshake ended after the seal would be reset unseen; with room for ``SEAL_BACKLOG`` half-open ones each is
    a row of ``/proc/net/tcp``, which shows whether a client got in before the seal (an unaccepted connection or
    a half-open one): it is taken and the seal made again. The connections taken are answered only once the
    socket is closed: a client answered during the seal comes straight back, and a burst of such connection
    attempts (more than ``SEAL_BACKLOG`` at once) is what makes Linux send SYN cookies, whose handshakes then
    complete unseen and are reset (answering while sealing: resets in 6 of 8 drains at load 8)."""
    deadline, taken = time.monotonic() + budget, Lingering()
    try:
        sock.listen(SEAL_BACKLOG)  # from here new connection attempts wait in the client's retries, then are refused
    except OSError:
        pass
    sock.setblocking(False)
    seals: List[socket.socket] = []
    for _ in range(SEAL_TRIES):
        _take_waiting(sock, deadline, seals, taken)
        for seal in seals:
            seal.close()
        seals = _seal(sock)
        if not seals or _sealed(sock, seals):
            break
        deadline = max(deadline, time.monotonic() + 0.05)  # a client got in before the seal: take it too
    return seals, taken


def _take_waiting(sock: socket.socket, deadline: float, seals: List[socket.socket], taken: "Lingering") -> None:
    """Accept what waits in the backlog (until it is empty, or ``deadline``) into ``taken``; our seal is dropped."""
    ours = {s.getsockname()[:2] for s in seals}
    while True:
        try:
            conn, peer = sock.accept()
        except (BlockingIOError, InterruptedError, OSError):
            return
        if peer[:2] in ours:
            conn.close()
            continue
        taken.add(conn)
        if time.monotonic() >= deadline:
            return


def _seal(sock: socket.socket) -> List[socket.socket]:
    """Connections of ours that fill ``sock``'s backlog (none where the kernel's table cannot be read: not Linux)."""
    if not os.path.exists(_TABLES[sock.family]):
        return []
    host, port = sock.getsockname()[:2]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    seals = []
    for _ in range(SEAL_BACKLOG + 1):  # Linux's backlog is full at one more than listen()'s number
        seal = socket.socket(sock.family, socket.SOCK_STREAM)
        seal.setblocking(False)
        seal.connect_ex((host, port))
        seals.append(seal)
    return seals


def _sealed(sock: socket.socket, seals: List[socket.socket], wait: float = 0.05) -> bool:
    """Whether the connections in ``sock``'s backlog are exactly ``seals`` and none is half-open (``/proc/net/tcp``)."""
    port, mine = sock.getsockname()[1], sorted(s.getsockname()[1] for s in seals)
    deadline = time.monotonic() + wait
    while True:
        queued, half_open = _backlog(_TABLES[sock.family], port)
        if sorted(queued) == mine and not half_open:
            return True
        if [p for p in queued if p not in mine] or time.monotonic() >= deadline:
            return False
        time.sleep(0.001)  # the seal's handshakes are not through yet


def _backlog(table: str, port: int) -> Tuple[List[int], int]:
    """``(remote ports of connections not yet accepted, count of half-open ones)`` on local ``port``: rows of
    ``table`` in state ESTABLISHED (01) with no socket inode, or SYN_RECV (03)."""
    queued, half_open = [], 0
    with open(table, encoding="ascii") as f:
        next(f)
        for row in f:
            fields = row.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if int(local.rsplit(":", 1)[1], 16) != port:
                continue
            if state == "03":
                half_open += 1
            elif state == "01" and inode == "0":
                queued.append(int(remote.rsplit(":", 1)[1], 16))
    return queued, half_open


class Lingering:
    """Connections taken from the backlog: answered 503 and half-closed (:meth:`answer`), then read until their
    clients close them (or :data:`LINGER` s after the answer), all at once in one thread (:meth:`join`).

    Closing a socket with bytes unread, or before the client's request arrives, makes the kernel reset the
    connection, and the client then reads the reset instead of the 503 already sent (Linux drops what the
    client had not read yet). A busy machine delays a client's request well past its connection's accept; read
    one connection at a time, the later ones in a large backlog were closed unread when a shared budget ran
    out (issue 31)."""

    def __init__(self):
        self._conns: List[socket.socket] = []
        self._thread: Optional[threading.Thread] = None
        self.answered = 0

    def add(self, conn: socket.socket) -> None:
        self._conns.append(conn)

    def answer(self, line: str) -> "Lingering":
        """503 ``line`` (Connection: close) to every connection taken, then read them in a thread."""
        until, kept = time.monotonic() + LINGER, []
        for conn in self._conns:
            try:
                conn.setblocking(False)
                conn.sendall(_raw(REFUSED_503, line))  # ~200 bytes: an empty send buffer takes them at once
                conn.shutdown(socket.SHUT_WR)
                kept.append(conn)
            except OSError:  # the client left already
                conn.close()
            self.answered += 1
        self._conns = kept
        if kept:
            self._thread = threading.Thread(target=self._run, args=(until,), name="serve-linger", daemon=True)
            self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        """Wait for the lingering connections (at most ``timeout`` s); any still open are closed."""
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))
        for conn in self._conns:
            _close_read(conn)

    def _run(self, until: float) -> None:
        with selectors.DefaultSelector() as sel:
            for conn in self._conns:
                sel.register(conn, selectors.EVENT_READ)
            while sel.get_map() and time.monotonic() < until:
                for key, _ in sel.select(max(0.001, until - time.monotonic())):
                    try:
                        if key.fileobj.recv(65536):
                            continue  # the client's request, read and dropped
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        pass
                    sel.unregister(key.fileobj)  # the client closed (or reset): nothing left to protect
                    key.fileobj.close()


def _close_read(conn: socket.socket) -> None:
    """Close ``conn`` after reading what its client sent (bytes left unread make the close a reset; at most 1 MiB:
    a client that keeps sending cannot hold the shutdown)."""
    try:
        conn.setblocking(False)
        for _ in range(16):
            if not conn.recv(65536):
                break
    except OSError:
        pass
    conn.close()


class OneWrite:
    """A request cycle's view of its connection's transport that sends an answer's status line and headers with
    the first part of its body, in one ``send()``: uvicorn writes them apart, and on a kept-alive connection each
    write is a TCP segment that wakes the client (which reads the headers, then waits for the body)."""

    def __init__(self, transport, conn: h11.Connection):
        self._transport, self._conn = transport, conn
        self._held: Optional[bytes] = None
        self._head_sent = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif not self._head_sent and self._conn.our_state is h11.SEND_BODY:  # the headers: the body follows
            self._head_sent = True
            self._held = data
            return
        if data:
            self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name):
        return getattr(self._transport, name)
