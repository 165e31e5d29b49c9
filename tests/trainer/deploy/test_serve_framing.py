"""HTTP framing per RFC 9112 against a real ``ptrain serve``, over raw sockets: a request that two readers could frame
apart (Content-Length with Transfer-Encoding, CL.TE and TE.CL) is answered 400 and its connection closed, and the
request smuggled behind it never runs (the server's own ``/metrics`` count it)."""

import json
import re
import socket

import pytest
from patience import patience
from serving import Server

BODY = json.dumps({"inputs": [[0.0] * 64]}).encode()
SMUGGLED = b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


@pytest.fixture(scope="module")
def server(digits_dir):
    server = Server(digits_dir[0], "--model_name", "digits")
    yield server
    assert server.stop() == 0


def _exchange(port, data, answers=1, wait=0.3):
    """Send ``data`` on a new connection and read ``answers`` answers: ``(their bytes, whether the server closed the
    connection after them)`` (one still open after them is read ``wait`` s more for a close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=patience(30)) as sock:
        sock.sendall(data)
        got = b""
        while _answers(got) < answers:
            part = sock.recv(65536)
            if not part:
                return got, True
            got += part
        sock.settimeout(wait)
        try:
            while True:  # the rest of an answer without Content-Length, then the close
                part = sock.recv(65536)
                if not part:
                    return got, True
                got += part
        except TimeoutError:
            return got, False


def _answers(got):
    """How many whole answers (head and Content-Length body; one without Content-Length ends at the close) ``got``
    holds."""
    count = 0
    while b"\r\n\r\n" in got:
        head, _, rest = got.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: (\d+)", head)
        if length is None:
            return count + 1
        length = int(length.group(1))
        if len(rest) < length:
            break
        count, got = count + 1, rest[length:]
    return count


def _v1_answered(server):
    """Requests /v1/predict has answered so far, and connections closed for their framing (``/metrics``)."""
    text = server.request("GET", "/metrics")[1]
    v1 = sum(float(v) for v in re.findall(r'^ptrain_serve_requests_total\{[^}]*protocol="v1"[^}]*\} (\S+)', text,
                                          re.MULTILINE))
    framing = re.search(r'^ptrain_serve_connections_closed_total\{reason="framing"\} (\S+)', text, re.MULTILINE)
    return v1, float(framing.group(1)) if framing else 0.0


def _head(extra):
    return b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
REFUSED = [  # (what a proxy in front and this server could read apart, refused by framing.py (else by h11), bytes)
    # CL.TE: a proxy framing by Content-Length forwards the smuggled request as this one's body
    ("CL.TE", True, _head(b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % (5 + len(SMUGGLED)))
     + b"0\r\n\r\n" + SMUGGLED),
    # TE.CL: a proxy framing by chunks forwards the smuggled request inside a chunk; Content-Length says 4 bytes
    ("TE.CL", True, _head(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n") + b"%x\r\n" % (len(SMUGGLED) + 4)
     + b"abcd" + SMUGGLED + b"\r\n0\r\n\r\n"),
    ("TE.CL, Content-Length first", True, _head(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n")
     + b"%x\r\n" % (len(SMUGGLED) + 4) + b"abcd" + SMUGGLED + b"\r\n0\r\n\r\n"),
    ("Transfer-Encoding in HTTP/1.0", True, _head(b"Transfer-Encoding: chunked\r\n").replace(b"HTTP/1.1", b"HTTP/1.0")
     + CHUNKED + SMUGGLED),
    ("two Content-Lengths", False, _head(b"Content-Length: %d\r\nContent-Length: 5\r\n" % len(BODY)) + BODY
     + SMUGGLED),
    ("chunked, identity", False, _head(b"Transfer-Encoding: chunked, identity\r\n") + CHUNKED + SMUGGLED),
    ("identity then chunked", False, _head(b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n")
     + CHUNKED + SMUGGLED),
]


@pytest.mark.parametrize("name,ours,data", REFUSED, ids=[r[0] for r in REFUSED])
def test_ambiguous_framing_is_refused_and_the_smuggled_request_never_runs(server, name, ours, data):
    before = _v1_answered(server)
    got, closed = _exchange(server.port, data, wait=patience(10))
    assert got.startswith(b"HTTP/1.1 400 ") and len(re.findall(rb"(?m)^HTTP/1\.1 \d{3} ", got)) == 1, got
    assert closed, f"{name}: the connection was left open after {got!r}"
    after = _v1_answered(server)
    assert after[0] == before[0], f"{name}: a smuggled request ran"
    if ours:
        assert b"RFC 9112 section 6.1" in got and after[1] == before[1] + 1, got  # one line, counted


def test_unambiguous_requests_keep_their_connection(server):
    """The same requests framed one way are answered and pipelined as usual; an obs-fold line is part of the header
    above it (RFC 9112 section 5.2), so a folded Transfer-Encoding frames nothing."""
    before = _v1_answered(server)
    got, closed = _exchange(server.port, _head(b"Content-Length: %d\r\n" % len(BODY)) + BODY + SMUGGLED, answers=2)
    assert got.count(b"HTTP/1.1 200 ") == 2 and not closed, got
    got, closed = _exchange(server.port, _head(b"Transfer-Encoding: chunked\r\n") + CHUNKED)
    assert got.count(b"HTTP/1.1 200 ") == 1 and not closed, got
    got, closed = _exchange(server.port, _head(b"Content-Length: %d\r\nX-A: b\r\n Transfer-Encoding: chunked\r\n"
                                               % len(BODY)) + BODY)
    assert got.count(b"HTTP/1.1 200 ") == 1 and not closed, got
    assert _v1_answered(server)[0] == before[0] + 4
