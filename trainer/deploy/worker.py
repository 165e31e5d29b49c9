"""The predictor worker process: one runtime, fed batches over a pipe by the server.

``paddle.inference`` holds the GIL while it runs, so the model cannot run in
the process that parses HTTP requests; each worker is its own process
(started with ``spawn``: paddle must not be forked). Its life:

1. dies with the server (``die_with_parent``: SIGKILL when the server process
   is gone, whatever killed it) and ignores SIGINT/SIGTERM (a Ctrl-C to the
   terminal's process group must not kill it while the server drains: the
   server ends it by closing the pipe);
2. fingerprints the model files (``predictor.fingerprint``) and, for a replacement, refuses files that differ
   from the ones the server serves (``options["fingerprint"]``); loads the runtime, runs a warm-up batch of 1
   and of ``max_batch_size`` rows,
   sends ``("ready", {"inputs", "outputs", "output_specs", "fingerprint", "call_ms", "pid"})`` (``output_specs``: the
   dtype and shape of each output of the warm-up run; ``call_ms``: the CPU ms of a warm call on ``max_batch_size``
   rows, None for inputs of unknown shape);
3. answers each ``(batch_id, [arrays])`` with ``(batch_id, "ok", [arrays])`` or
   ``(batch_id, "error", "<one line>")``; an end of the pipe (or ``None``) ends it.

A failure to load sends ``("failed", "<one line>")`` and exits 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict


class ModelChanged(RuntimeError):
    """The model files differ from the ones the server's other predictor processes serve."""


def first_line(exc: BaseException) -> str:
    if isinstance(exc, ModelChanged):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1].strip() if text else ''}".rstrip(": ")


def load_checked(options: Dict[str, Any]):
    """``(runtime, {"inputs", "outputs", "output_specs", "fingerprint", "call_ms"})``: the model of ``options`` loaded
    and warmed up, its files fingerprinted (ModelChanged if they are not ``options["fingerprint"]``, or
    changed during the load). Used by the worker process, and by the server itself for ``--workers 0``."""
    from .predictor import files_state, fingerprint
    from .runtimes import load_runtime, synthetic_batch

    before = files_state(options["model_dir"], options.get("prefix"))
    mine = fingerprint(options["model_dir"], options.get("prefix"))
    expected = options.get("fingerprint")
    if expected is not None and mine != expected:
        raise ModelChanged(f"the model files in {options['model_dir']} changed since the server loaded them "
                           f"({expected[:19]}, now {mine[:19]}): refusing to serve a second model behind one "
                           "name; restart the server to serve the new export")
    runtime = load_runtime(options["runtime"], options["model_dir"], options.get("device", "cpu"),
                           int(options.get("threads", 1)), options.get("prefix"))
    seen = []
    for rows in sorted({1, int(options.get("max_batch_size", 1))}):
        if all(s.get("shape") for s in runtime.inputs):
            seen = [{"dtype": str(o.dtype), "shape": [-1] + list(o.shape[1:])}
                    for o in runtime.run(synthetic_batch(runtime.inputs, rows))]
    call_ms = _call_ms(runtime, synthetic_batch(runtime.inputs, int(options.get("max_batch_size", 1)))) if seen else None
    if files_state(options["model_dir"], options.get("prefix")) != before:
        raise ModelChanged(f"the model files in {options['model_dir']} changed while loading: start again")
    return runtime, {"inputs": runtime.inputs, "outputs": runtime.outputs, "output_specs": seen, "fingerprint": mine,
                     "call_ms": call_ms}


def _call_ms(runtime, batch, repeats: int = 5) -> float:
    """The model's warm call on ``batch``: the median CPU ms of this process (CPU time, not the clock: a busy
    machine's waits for a core are not the model's cost)."""
    times = []
    for _ in range(repeats):
        started = time.process_time()
        runtime.run(batch)
        times.append((time.process_time() - started) * 1000)
    return sorted(times)[len(times) // 2]


def _leave_stopping_to_the_server() -> None:
    """SIGINT and SIGTERM sent to the whole process group (a terminal's Ctrl-C, systemd's stop, ``kill -TERM
    -PGID``) reach this process too: the server drains and stops it, so it ignores them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def worker_main(conn, options: Dict[str, Any], parent_pid: int) -> None:
    """The worker's entry point (``multiprocessing`` target). ``options``: model_dir, prefix, runtime,
    device, threads, max_batch_size."""
    from ..process import die_with_parent

    _leave_stopping_to_the_server()
    die_with_parent(signal.SIGKILL, parent_pid)
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        runtime, info = load_checked(options)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which exits with it
        conn.send(("failed", first_line(exc)))
        sys.exit(1)
    _leave_stopping_to_the_server()  # paddle's loader installed its own SIGTERM/SIGINT handlers: ignored again
    conn.send(("ready", dict(info, pid=os.getpid())))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        batch_id, arrays = message
        try:
            outputs = runtime.run(arrays)
        except Exception as exc:  # noqa: BLE001 - the batch's requests get the line; the worker goes on
            conn.send((batch_id, "error", first_line(exc)))
            continue
        conn.send((batch_id, "ok", [o for o in outputs]))
    conn.close()
    os._exit(0)  # nothing to flush; paddle's teardown would only lengthen the server's drain
