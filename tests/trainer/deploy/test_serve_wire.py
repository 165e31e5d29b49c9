"""What goes on the wire: an answer's status line, headers and body leave in one write (``connections.OneWrite``),
an interim ``100 Continue`` and a headers-only answer are not held back, and a kept-alive connection carries
requests of every kind in turn. The unit test drives a real ``h11`` connection as uvicorn's request cycle does;
the others speak raw HTTP/1.1 to a real server process."""

import json
import socket

import h11
import numpy as np
from patience import patience
from serving import Server

from trainer.deploy.connections import OneWrite
from trainer.deploy.predictor import create_predictor, run_predictor


class _Recorder:
    def __init__(self):
        self.writes, self.closed, self.eof = [], False, False

    def write(self, data):
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def close(self):
        self.closed = True

    def write_eof(self):
        self.eof = True

    def is_closing(self):
        return self.closed


def _cycle(request_headers):
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + request_headers + b"\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    recorder = _Recorder()
    return conn, recorder, OneWrite(recorder, conn)


def test_one_write_sends_head_and_body_together_and_holds_nothing_else():
    conn, recorder, transport = _cycle(b"")
    head = conn.send(h11.Response(status_code=200, headers=[("content-length", "7")]))
    transport.write(head)  # what uvicorn's cycle does at http.response.start
    assert recorder.writes == []
    transport.write(conn.send(h11.Data(data=b"answer!")))
    transport.write(conn.send(h11.EndOfMessage()))  # b"" for a sized body: nothing to send
    assert recorder.writes == [head + b"answer!"]
    assert transport.is_closing() is False  # everything else is the transport's own

    conn, recorder, transport = _cycle(b"Expect: 100-continue\r\n")  # the interim answer goes at once
    interim = conn.send(h11.InformationalResponse(status_code=100, headers=[]))
    transport.write(interim)
    assert recorder.writes == [interim]

    conn, recorder, transport = _cycle(b"")  # a headers-only answer (HEAD, 204): sent when the response completes
    head = conn.send(h11.Response(status_code=204, headers=[]))
    transport.write(head)
    transport.flush()
    assert recorder.writes == [head]

    conn, recorder, transport = _cycle(b"")  # closed with the head held: it is sent before the close
    head = conn.send(h11.Response(status_code=200, headers=[("content-length", "1")]))
    transport.write(head)
    transport.close()
    assert recorder.writes == [head] and recorder.closed

    conn, recorder, transport = _cycle(b"")  # a streamed body: every chunk after the first goes out as it comes
    head = conn.send(h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")]))
    transport.write(head)
    first, second = conn.send(h11.Data(data=b"ab")), conn.send(h11.Data(data=b"cd"))
    transport.write(first)
    transport.write(second)
    assert recorder.writes == [head + first, second]


def _read_answer(sock):
    """``(status, headers dict, body)`` of one answer read from ``sock`` (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def test_a_kept_alive_connection_answers_100_continue_head_and_requests_in_turn(digits_dir):
    path, x = digits_dir
    (expected,) = run_predictor(create_predictor(path), [x[:2]])
    server = Server(path)
    try:
        body = json.dumps({"inputs": x[:2].tolist()}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=patience(30)) as s:
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
            interim = s.recv(4096)  # the body is not sent until the server asks for it
            assert interim.startswith(b"HTTP/1.1 100 "), interim
            s.sendall(body)
            status, headers, answer = _read_answer(s)
            assert status == 200 and headers["content-type"] == "application/json"
            np.testing.assert_array_equal(np.asarray(json.loads(answer)["outputs"], dtype="float32"), expected)

            s.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # an answer without a body
            assert _read_answer(s)[0] == 200
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_answer(s)[0] == 200
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            status, _, answer = _read_answer(s)
            assert status == 200
            np.testing.assert_array_equal(np.asarray(json.loads(answer)["outputs"], dtype="float32"), expected)
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n[1,2]")  # an error answer
            status, _, answer = _read_answer(s)
            assert status == 400 and "error" in json.loads(answer)
    finally:
        assert server.stop() == 0
