"""ptrain serve in tests: a real ``python -m trainer.cli serve`` subprocess on a free loopback port.

``Server(model_dir, *flags)`` starts one and waits for its ready line (``--port 0``: the port and the predictor
pids are read from it); ``request`` / ``predict`` / ``infer`` talk HTTP to it; ``stop`` sends SIGTERM, waits,
and checks that no predictor process outlived it.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from helpers import REPO as ROOT

READY = re.compile(r"ready on http://127\.0\.0\.1:(\d+) .* pid (\d+(?:,\d+)*)")
from patience import patience


class Server:
    def __init__(self, model_dir, *flags, timeout=120, preexec_fn=None):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "serve",
                                      *([model_dir] if isinstance(model_dir, str) else model_dir), "--port", "0", *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                                     preexec_fn=preexec_fn)
        self.err_lines = []
        self._reader = threading.Thread(target=self._read_err, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        line = ""
        try:
            while time.monotonic() < deadline:
                line = self.proc.stdout.readline()
                if not line and self.proc.poll() is not None:
                    break
                m = READY.search(line)
                if m:
                    self.port, self.pids = int(m.group(1)), [int(p) for p in m.group(2).split(",")]
                    self.ready_line = line
                    return
        except BaseException:
            self.stop(sig=signal.SIGKILL)  # never leave a server behind, whatever failed here
            raise
        self.stop()
        raise AssertionError(f"the server did not get ready: {line!r} {''.join(self.err_lines)[-2000:]}")

    def _read_err(self):
        for line in self.proc.stderr:
            self.err_lines.append(line)

    @property
    def err(self):
        """What the server wrote to stderr; once it has exited, all of it (its last lines can still be in the pipe
        when ``wait()`` returns: the reader thread is given the time to reach the end, stretched by the load)."""
        if self.proc.poll() is not None:
            self._reader.join(timeout=patience(30))
        return "".join(self.err_lines)

    def err_with(self, text, timeout=10):
        """The server's stderr once it holds ``text`` (a line printed before the ready line can reach the reader
        thread after it, under load), or as it is after ``timeout`` (stretched by the load) if it never does."""
        deadline = time.monotonic() + patience(timeout)
        while text not in self.err and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.err

    def request(self, method, path, body=None, headers=None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            data = r.read()
            return r.status, (json.loads(data) if r.getheader("content-type", "").startswith("application/json")
                              else data.decode()), dict(r.getheaders())
        finally:
            conn.close()

    def predict(self, body, **kw):
        return self.request("POST", "/v1/predict", body, **kw)

    def infer(self, model, body, **kw):
        return self.request("POST", f"/v2/models/{model}/infer", body, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            time.sleep(0.2)
            for pid in getattr(self, "pids", []):
                assert not _alive(pid), f"predictor process {pid} outlived the server"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False




def load_clients(server, count, body, pause=0.01):
    """``count`` threads sending ``body`` to ``/v1/predict`` back to back, each on a new connection, until
    ``stop`` is set: ``(results, stop, threads)``, a result being a status or the name of the connection error."""
    results, stop = [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                results.append(server.predict(body, timeout=patience(30))[0])
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                results.append(type(exc).__name__)
                time.sleep(pause)

    threads = [threading.Thread(target=client) for _ in range(count)]
    for t in threads:
        t.start()
    return results, stop, threads


def batch_stats(server):
    """``(model calls, rows)`` so far, from ``/metrics``' ``ptrain_serve_batch_size`` histogram."""
    text = server.request("GET", "/metrics")[1]
    count = float(re.search(r"^ptrain_serve_batch_size_count (\S+)", text, re.M).group(1))
    total = float(re.search(r"^ptrain_serve_batch_size_sum (\S+)", text, re.M).group(1))
    return count, total


def concurrent_rows(server, rows, expected):
    """Send each of ``rows`` (one instance each) at once from its own thread, check every answer against
    ``expected[i]``; ``(model calls, rows)`` they took (from :func:`batch_stats`)."""
    import concurrent.futures as cf

    import numpy as np

    before = batch_stats(server)
    with cf.ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(lambda i: server.predict({"inputs": rows[i:i + 1].tolist()}), range(len(rows))))
    for i, (status, body, _) in enumerate(answers):
        assert status == 200, body
        np.testing.assert_allclose(np.asarray(body["outputs"], dtype="float32"), expected[i], rtol=1e-5, atol=1e-6)
    after = batch_stats(server)
    return after[0] - before[0], after[1] - before[1]
