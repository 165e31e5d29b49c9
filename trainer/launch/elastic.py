"""``python trainer/launch/elastic.py ARGS``: ``python -m paddle.distributed.launch ARGS`` with an etcd master.

Paddle's launcher does all the work (etcd rendezvous, heartbeats, starting and stopping the workers,
restarting them when a peer's heartbeat changes). This wrapper adds three things ``trainer.launch.restarts``
needs, and nothing to the launcher's behaviour:

- the etcd client (``etcd3``) is generated code that fails with protobuf >= 4 unless
  ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``: it is set while this process imports protobuf and
  removed again before paddle copies the environment for the workers, which keep the fast protobuf;
- each restart the launcher makes of its workers is logged with its cause (``ptrain: node restart``);
- a node beyond ``--nnodes MAX`` is refused before it registers: paddle's launcher would delete the job's
  heartbeats (``register_heartbeat``) and so restart every running node. When MAX nodes of the job already
  renew their etcd heartbeat, this node waits ``FULL_WAIT_SECONDS`` (paddle's heartbeat TTL is 10 s, so the
  heartbeat of this node's own earlier launcher, killed just now, runs out meanwhile) and then exits
  ``REFUSED`` (2) with one line, touching nothing in etcd; a launcher that stops before the job completed
  removes its own heartbeat, so its relaunch is not kept waiting by it;
- the outcome goes to the JSON file named by ``PTRAIN_LAUNCH_STATUS`` (restarts made, the cause of the
  stop) and the exit code says what ``trainer.launch.restarts`` may do: 0 the job completed; a worker's own exit
  code when it failed first (``restarts.NO_RESTART`` lists those never restarted); ``GAVE_UP`` (75) when the launcher
  stopped before the job completed for any other reason ("peer not ready", restarts used, ...);
  130/143 when this launcher was interrupted/terminated.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

PROTOBUF = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
GAVE_UP = 75  # = trainer.launch.restarts.GAVE_UP; not imported: this file runs as a script, before paddle's launcher
REFUSED = 2  # = trainer.errors.ConfigError.exit_code: a node beyond --nnodes MAX (never restarted)
FULL_WAIT_SECONDS = 12.0  # paddle's etcd heartbeat TTL (10 s) and a margin


def _import_etcd_client() -> None:
    had = PROTOBUF in os.environ
    os.environ.setdefault(PROTOBUF, "python")
    try:
        import etcd3  # noqa: F401 - paddle's ETCDMaster imports it; the protobuf implementation is chosen now
    except ImportError as exc:
        print(f"ptrain: error: an etcd master needs the etcd client ({exc}): "
              'pip install -e ".[elastic]" in the paddle-trainer checkout', file=sys.stderr)
        sys.exit(2)
    finally:
        if not had:
            del os.environ[PROTOBUF]  # the workers inherit this process's environment: keep them on upb


class _Observer(threading.Thread):
    """Watches the launcher's pod (public properties only): logs each restart it makes, with its cause."""

    def __init__(self, ctx, controller):
        super().__init__(name="ptrain-observer", daemon=True)
        self.ctx, self.c = ctx, controller
        self.first_failure = None  # (local rank, exit code) of the first worker of the current start seen failing
        self.cause = None
        self._seen = -1  # the start (pod.restart) whose failure or restart was handled

    def run(self):
        while True:
            self.poll()
            time.sleep(0.2)

    def poll(self):
        pod, status = self.c.pod, self.ctx.status
        started = pod.restart  # -1 before the first start, then the number of restarts made
        if started < 0 or started == self._seen:
            return
        failed = [(i, c.exit_code) for i, c in enumerate(list(pod.containers)) if c.status == "failed"]
        if failed and not status.is_restarting():
            # when two are seen at once, the one paddle did not stop itself (SIGTERM: 143 or -15) failed first
            own = [f for f in failed if f[1] not in (143, -signal.SIGTERM)] or failed
            self._seen, self.first_failure = started, own[0]
            self.cause = f"worker {own[0][0]} on this node exited with code {own[0][1]}"
            return  # at --elastic_level 0 the launcher stops; trainer.launch.restarts decides whether to restart it
        if status.is_restarting():
            self._seen = started
            self.cause = "a peer node failed, left or joined (its etcd heartbeat changed)"
            print(f"ptrain: node restart {started + 1} at {time.strftime('%H:%M:%S')}: {self.cause}; this node's "
                  "workers stop, rendezvous again and resume from the newest complete checkpoint",
                  file=sys.stderr, flush=True)


def nodes_alive(master: str, job_id: str) -> int:
    """How many nodes of ``job_id`` renew their heartbeat in etcd (paddle's keys /paddle/JOB/heartbeat/POD)."""
    import etcd3

    host, _, port = master[len("etcd://"):].rpartition(":")
    client = etcd3.client(host=host, port=int(port))
    try:
        return sum(1 for _ in client.get_prefix(f"/paddle/{job_id}/heartbeat"))
    finally:
        client.close()


def refuse_beyond_max(master: str, job_id: str, nnodes) -> str:
    """"" when this node fits in the job, else the one line that refuses it (after waiting FULL_WAIT_SECONDS)."""
    most = str(nnodes or "").split(":")[-1]
    if not most.isdigit():
        return ""
    most = int(most)
    deadline = time.monotonic() + FULL_WAIT_SECONDS
    said = False
    while True:
        alive = nodes_alive(master, job_id)
        if alive < most:
            return ""
        if time.monotonic() >= deadline:
            return (f"job {job_id} already runs on {alive} node(s), the most --nnodes {nnodes} allows: this node was "
                    "not started and the running nodes were not disturbed; start it with another --job_id, or give "
                    "the job a larger --nnodes MIN:MAX from its start")
        if not said:
            print(f"ptrain: job {job_id} has {alive} of at most {most} nodes alive in etcd: waiting up to "
                  f"{FULL_WAIT_SECONDS:.0f} s for one to leave", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)


def _leave(c, job_id: str) -> None:
    """Remove this launcher's own heartbeat after a failure (its peers restart anyway), so that its relaunch
    is not counted twice by :func:`refuse_beyond_max` while the old heartbeat's TTL runs out."""
    try:
        c.master.client.delete(f"/paddle/{job_id}/heartbeat/{c.pod.name}")
    except Exception:  # noqa: BLE001 - best effort: the heartbeat's TTL (10 s) removes it anyway
        pass


def main() -> int:
    status_path = os.environ.pop("PTRAIN_LAUNCH_STATUS", None)
    _import_etcd_client()
    from paddle.distributed.launch import controllers
    from paddle.distributed.launch.context import Context

    ctx = Context()
    try:
        refusal = refuse_beyond_max(ctx.args.master, ctx.args.job_id, ctx.args.nnodes)
    except Exception as exc:  # noqa: BLE001 - etcd unreachable: the launcher reports it as before
        refusal = ""
        print(f"ptrain: could not count the job's nodes in etcd ({type(exc).__name__}: {exc})", file=sys.stderr,
              flush=True)
    if refusal:
        print(f"ptrain: error: {refusal}", file=sys.stderr, flush=True)
        if status_path:
            with open(status_path, "w", encoding="utf-8") as f:
                json.dump({"restarts": 0, "cause": refusal, "exit_code": REFUSED}, f)
        return REFUSED
    c = controllers.init(ctx)
    observer = _Observer(ctx, c)
    observer.start()
    code, cause = None, None
    try:
        c.run()
    except SystemExit as exc:  # paddle's signal handler: sys.exit(signal number)
        code = 130 if exc.code == signal.SIGINT else 143
        cause = f"the launcher received signal {exc.code}"
    except Exception as exc:  # noqa: BLE001 - e.g. etcd unreachable mid-job: one line, the workers stopped
        cause = f"the launcher failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(f"ptrain: {cause} (is the etcd master {ctx.args.master} up?)", file=sys.stderr, flush=True)
        c.stop()
        code = GAVE_UP
    if code is None:
        observer.poll()
        completed = bool(c.pod.containers) and c.pod.is_completed()  # every worker of the last start exited 0
        c.finalize(exit=False)
        if completed:
            code = 0
        elif observer.first_failure:  # its own code: trainer.launch.restarts decides (NO_RESTART) whether to restart
            code, cause = observer.first_failure[1] if observer.first_failure[1] > 0 else GAVE_UP, observer.cause
        else:
            code, cause = GAVE_UP, observer.cause or "the launcher stopped before the job completed (peer not ready)"
        if not completed:
            _leave(c, ctx.args.job_id)
    if status_path:
        with open(status_path, "w", encoding="utf-8") as f:
            json.dump({"restarts": max(c.pod.restart, 0), "cause": cause, "exit_code": code}, f)
    return code


if __name__ == "__main__":
    # run as a file, not as a module: importing the trainer package would import paddle, hence protobuf,
    # before the etcd client's setting; and Python put this folder, whose modules would shadow
    # others, first on sys.path: drop it
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.exit(main())
