"""How a request's body is framed, decided once: a request whose framing two readers could read apart is refused.

h11 frames a request that carries both ``Content-Length`` and
``Transfer-Encoding: chunked`` by its chunks and keeps the connection open. A
proxy in front that frames it by ``Content-Length`` (or the other way round)
then reads the bytes after the last chunk as the body while this server reads
them as a second request: the request smuggling of RFC 9112 §11.2 (CL.TE,
TE.CL). RFC 9112 §6.1 lets a server refuse such a message, and asks it to
treat ``Transfer-Encoding`` in an HTTP/1.0 request as faulty framing. So
:class:`FramedConnection` (the h11 connection of every client,
``connections.GuardedH11Protocol``) refuses, as soon as the request's head is
read and before any of its body or anything after it is:

- ``Content-Length`` together with ``Transfer-Encoding`` (any value, any order);
- ``Transfer-Encoding`` in an HTTP/1.0 request.

The client gets ``400 {"error": "<one line>"}`` with ``Connection: close`` and
the connection is closed: nothing it sent after that head is read as a
request. h11 itself already refuses (400, closed) two ``Content-Length``
values that differ, a ``Content-Length`` that is not ASCII digits, and any
``Transfer-Encoding`` but ``chunked`` (``chunked, identity``, ``xchunked``,
``identity`` then ``chunked``); it unfolds an obs-fold line into the value of
the header above it (RFC 9112 §5.2: ``Foo: bar\\r\\n Transfer-Encoding:
chunked`` is one header ``Foo``), which frames nothing.
"""

from __future__ import annotations

import h11

BAD_400 = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"content-length: %d\r\n\r\n%s")


def framing_error(event: h11.Request) -> str | None:
    """The one line refusing ``event``'s framing (see the module docstring), or None when it is unambiguous."""
    names = [name.lower() for name, _ in event.headers.raw_items()]  # a list: Headers iterates in Python
    te, cl = b"transfer-encoding" in names, b"content-length" in names
    if te and cl:
        return ("the request has both Content-Length and Transfer-Encoding, which frame its body differently "
                "(RFC 9112 section 6.1): send one of them")
    if te and event.http_version == b"1.0":
        return "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1): send Content-Length"
    return None


class FramedConnection(h11.Connection):
    """h11's server connection that raises ``h11.RemoteProtocolError`` for a request :func:`framing_error` refuses,
    keeping the line in ``refused`` for the answer (``GuardedH11Protocol.send_400_response``)."""

    refused: str | None = None

    def next_event(self):
        event = super().next_event()
        if type(event) is h11.Request:
            line = framing_error(event)
            if line is not None:
                self.refused = line
                raise h11.RemoteProtocolError(line, 400)
        return event
