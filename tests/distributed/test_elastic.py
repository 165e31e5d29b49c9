"""Elastic, fault-tolerant training: a real etcd server and two ``ptrain launch`` nodes on loopback.

Each node is ``ptrain launch --nproc 1 --master etcd://... SCRIPT`` (one worker), so two nodes make the
2-process job of the reference run. The script (workers/elastic_toy.py) is a plain Trainer script.
(a) a worker dies, (b) a node dies (odd trials: rank 0's node, (e)), (c) a node joins, (d) etcd restarts.
(a) and (b) run PTRAIN_ELASTIC_TRIALS times (default 1); PTRAIN_ELASTIC_REPORT=FILE appends one JSON line
per trial (restarts, seconds from the kill to the first step trained after it, parameter difference).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from helpers import REPO, free_port, process_tree
from patience import patience
from safetensors.numpy import load_file

TRIALS = int(os.environ.get("PTRAIN_ELASTIC_TRIALS", "1"))
WORKER = os.path.join(REPO, "tests", "distributed", "workers", "elastic_toy.py")
STEPS, PACE = 24, 0.25
ENV = dict(os.environ, PYTHONPATH=REPO)
pytestmark = pytest.mark.timeout(900)


# ---- etcd -------------------------------------------------------------------------
def _etcd_executable():
    found = shutil.which("etcd")
    if found or os.environ.get("CI", "").lower() != "true":
        return found
    if os.geteuid() == 0:  # CI on a fresh Debian/Ubuntu machine: Debian's etcd-server package
        subprocess.run(["apt-get", "update", "-q"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-q", "etcd-server"], check=False,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    return shutil.which("etcd") or (os.path.exists("/usr/bin/etcd") and "/usr/bin/etcd")


class Etcd:
    """One etcd member on free loopback ports, in its own data directory."""

    def __init__(self, exe, data_dir):
        self.exe, self.data_dir = exe, data_dir
        self.port, self.peer_port = free_port(), free_port()
        self.url = f"etcd://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.log = open(os.path.join(os.path.dirname(self.data_dir), "etcd.log"), "a")
        self.proc = subprocess.Popen(
            [self.exe, "--name", "t", "--data-dir", self.data_dir,
             "--listen-client-urls", f"http://127.0.0.1:{self.port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + patience(60)
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=patience(1)):
                    return
            except OSError:
                assert self.proc.poll() is None, open(self.log.name).read()[-2000:]
                time.sleep(0.1)
        raise AssertionError("etcd did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=patience(30))
        self.log.close()


@pytest.fixture(scope="module")
def etcd_exe():
    exe = _etcd_executable()
    if not exe:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("etcd is missing in CI and apt-get install etcd-server did not provide it")
        pytest.skip("etcd is not installed (Debian/Ubuntu: apt-get install etcd-server); CI installs it")
    return exe


@pytest.fixture(scope="module")
def etcd(etcd_exe, tmp_path_factory):
    server = Etcd(etcd_exe, str(tmp_path_factory.mktemp("etcd") / "data"))
    server.start()
    yield server
    server.stop()


# ---- nodes --------------------------------------------------------------------------
class Node:
    """``ptrain launch`` as one node; ``kill()`` kills it whole (ptrain, launcher, workers) with SIGKILL."""

    def __init__(self, name, tmp, master, job, out, nnodes, worker_args=(), max_restarts=4, steps=STEPS):
        self.name, self.err_path = name, os.path.join(tmp, f"{name}.err")
        self.err = open(self.err_path, "w")
        cmd = [sys.executable, "-m", "trainer.cli", "launch", "--nproc", "1", "--nnodes", nnodes, "--master", master,
               "--job_id", job, "--max_restarts", str(max_restarts), "--elastic_timeout", "6",
               "--log_dir", os.path.join(tmp, f"log-{name}"), WORKER, out, str(steps), str(PACE), *worker_args]
        self.proc = subprocess.Popen(cmd, env=ENV, cwd=REPO, stdout=self.err, stderr=subprocess.STDOUT)

    def tree(self):
        return process_tree(self.proc.pid)

    def kill(self):
        for p in self.tree():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass

    def wait(self, timeout=420):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.err.close()

    def output(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()


@pytest.fixture
def nodes():
    started = []
    yield started
    for node in started:  # leave no process behind, whatever happened
        node.kill()
        node.proc.wait(timeout=patience(30))


def worker_pid(out, rank):
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if WORKER in cmd and out in cmd and p.environ().get("PADDLE_TRAINER_ID") == str(rank):
                return p.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def node_of(nodes, out, rank):
    pid = worker_pid(out, rank)
    for node in nodes:
        if pid in {p.pid for p in node.tree()}:
            return node
    raise AssertionError(f"no node runs rank {rank}")


def progress(out):
    path = os.path.join(out, "progress.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_until(condition, what, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def training_at(out, step):
    """Training reached ``step`` and a checkpoint exists."""
    rows = progress(out)
    return bool(rows) and rows[-1]["step"] >= step and os.path.exists(os.path.join(out, "checkpoints", "latest"))


def resumed_after(out, killed_at):
    """Seconds from the kill to the first step trained by a process started after it, and that row."""
    rows = progress(out)
    before = {r["pid"] for r in rows if r["t"] < killed_at}
    after = [r for r in rows if r["t"] >= killed_at and r["pid"] not in before]
    assert after, "no step was trained after the kill"
    return round(after[0]["t"] - killed_at, 2), after[0]


def final_model(out):
    with open(os.path.join(out, "checkpoints", "latest")) as f:
        latest = f.read().strip()
    return load_file(os.path.join(out, "checkpoints", latest, "model.safetensors"))


def result(out):
    with open(os.path.join(out, "result.json")) as f:
        return json.load(f)


def report(**row):
    print(json.dumps(row))
    path = os.environ.get("PTRAIN_ELASTIC_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def finish(nodes, *survivors):
    codes = [node.wait() for node in survivors]
    logs = "\n".join(f"--- {n.name}\n{n.output()}" for n in nodes)
    assert codes == [0] * len(survivors), logs[-8000:]
    return logs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 2-process run (no etcd, no restarts): final parameters and LR."""
    out = str(tmp_path_factory.mktemp("reference") / "out")
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "launch", "--nproc", "2",
                           "--log_dir", out + "-logs", WORKER, out, str(STEPS), "0"],
                          env=ENV, cwd=REPO, capture_output=True, text=True, timeout=patience(400))
    assert done.returncode == 0, done.stderr[-3000:]
    return final_model(out), result(out)


# ---- (a) a worker dies ---------------------------------------------------------------
@pytest.mark.parametrize("trial", range(TRIALS))
def test_killed_worker_restarts_every_node_and_matches_the_uninterrupted_run(etcd, reference, nodes, tmp_path, trial):
    out, job = str(tmp_path / "out"), f"a{trial}-{os.getpid()}"
    nodes += [Node(f"n{i}", str(tmp_path), etcd.url, job, out, "2") for i in range(2)]
    wait_until(lambda: training_at(out, 6), "training to reach step 6")
    rank = trial % 2  # alternate which rank's worker dies
    os.kill(worker_pid(out, rank), signal.SIGKILL)
    killed_at = time.time()
    logs = finish(nodes, *nodes)
    assert "ptrain: restart 1 of 4" in logs or "ptrain: node restart 1" in logs, logs[-8000:]
    seconds, row = resumed_after(out, killed_at)
    want, got = reference[0], final_model(out)
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    report(test="a", trial=trial, killed_rank=rank, resume_seconds=seconds, resumed_at_step=row["step"],
           restarts=logs.count("ptrain: restart ") + logs.count("ptrain: node restart "), worst_param_diff=worst)
    assert result(out)["global_step"] == STEPS and result(out)["world_size"] == 2
    with open(os.path.join(str(tmp_path), "log-n0", "envlog.0")) as f:  # the workers' environment, by paddle
        env = f.read()
    assert "PTRAIN_RESUME=auto" in env and "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION" not in env
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ---- (b) and (e) a whole node dies -----------------------------------------------------
def _lose_a_node(etcd, reference, nodes, tmp_path, killed_rank, label):
    out, job = str(tmp_path / "out"), f"{label}-{os.getpid()}"
    nodes += [Node(f"n{i}", str(tmp_path), etcd.url, job, out, "1:2") for i in range(2)]
    wait_until(lambda: training_at(out, 6) and progress(out)[-1]["world_size"] == 2, "2-node training at step 6")
    victim = node_of(nodes, out, killed_rank)
    survivor = next(n for n in nodes if n is not victim)
    victim.kill()
    killed_at = time.time()
    logs = finish(nodes, survivor)
    seconds, row = resumed_after(out, killed_at)
    res = result(out)
    report(test=label, killed_rank=killed_rank, resume_seconds=seconds, resumed_at_step=row["step"],
           world_size_after=row["world_size"], final=res)
    assert row["world_size"] == 1 and res["world_size"] == 1, logs[-8000:]
    assert res["global_step"] == STEPS and res["status"] == "completed"
    assert res["gradient_accumulation_steps"] == 2  # the global batch of 2 nodes, kept by accumulation
    assert res["lr"] == reference[1]["lr"]  # the schedule reached its end, as in the uninterrupted run


@pytest.mark.parametrize("trial", range(TRIALS))
def test_lost_node_leaves_the_other_finishing_alone(etcd, reference, nodes, tmp_path, trial):
    """(b) a whole node dies; odd trials kill the node of rank 0, (e): the survivor becomes rank 0."""
    _lose_a_node(etcd, reference, nodes, tmp_path, killed_rank=(trial + 1) % 2, label=f"b{trial}")


# ---- (c) a node joins ----------------------------------------------------------------
def test_node_started_later_joins_at_the_next_restart(etcd, nodes, tmp_path):
    out, job = str(tmp_path / "out"), f"c-{os.getpid()}"
    steps = 4 * STEPS  # long enough at world size 1 for the second node to start up and join
    nodes.append(Node("n0", str(tmp_path), etcd.url, job, out, "1:2", worker_args=["2"], steps=steps))
    wait_until(lambda: training_at(out, 4), "one node training alone")
    assert progress(out)[-1]["world_size"] == 1
    nodes.append(Node("n1", str(tmp_path), etcd.url, job, out, "1:2", worker_args=["2"], steps=steps))
    joined_at = time.time()
    finish(nodes, *nodes)
    rows = progress(out)
    grown = [r for r in rows if r["t"] >= joined_at and r["world_size"] == 2]
    assert grown, rows[-5:]
    report(test="c", join_seconds=round(grown[0]["t"] - joined_at, 2), grew_at_step=grown[0]["step"])
    assert result(out)["world_size"] == 2 and result(out)["global_step"] == steps
    assert result(out)["gradient_accumulation_steps"] == 1  # global batch of the 1-node start (4 x 2), kept


# ---- (d) etcd goes away and comes back ---------------------------------------------------
def test_etcd_restarted_mid_run_the_job_carries_on_or_stops_with_one_clear_line(etcd_exe, nodes, tmp_path):
    server = Etcd(etcd_exe, str(tmp_path / "etcd" / "data"))
    os.makedirs(os.path.dirname(server.data_dir))
    server.start()
    try:
        out, job = str(tmp_path / "out"), f"d-{os.getpid()}"
        nodes += [Node(f"n{i}", str(tmp_path), server.url, job, out, "2") for i in range(2)]
        wait_until(lambda: training_at(out, 4), "training to reach step 4")
        server.stop()
        time.sleep(3)
        server.start()
        codes = [n.wait() for n in nodes]
    finally:
        server.stop()
    logs = "\n".join(n.output() for n in nodes)
    report(test="d", exit_codes=codes, final=result(out) if os.path.exists(os.path.join(out, "result.json")) else None)
    if codes == [0, 0]:
        assert result(out)["global_step"] == STEPS
    else:
        for node in nodes:
            last = [line for line in node.output().splitlines() if line.startswith("ptrain:")][-1]
            assert "etcd" in last, logs[-4000:]


# ---- (f) a node beyond --nnodes MAX --------------------------------------------------------
def test_node_beyond_nnodes_max_is_refused_and_never_disturbs_the_running_nodes(etcd, nodes, tmp_path):
    """Issue 19, 7. Before: the third node's launcher deleted the job's heartbeats on registering, every node
    restarted, one exited 75 ("all 2 restarts are used") and the others were still restarting 210 s later."""
    out, job = str(tmp_path / "out"), f"f-{os.getpid()}"
    steps = 6 * STEPS  # long enough for the third node to start up, wait for a free place and be refused
    nodes += [Node(f"n{i}", str(tmp_path), etcd.url, job, out, "2", steps=steps) for i in range(2)]
    wait_until(lambda: training_at(out, 4) and progress(out)[-1]["world_size"] == 2, "2-node training at step 4")
    third = Node("n2", str(tmp_path), etcd.url, job, out, "2", steps=steps)
    nodes.append(third)
    started = time.time()
    code = third.wait(timeout=patience(180))
    text = third.output()
    refused = [line for line in text.splitlines() if line.startswith("ptrain: error:")]
    assert code == 2, text[-4000:]
    assert len(refused) == 1 and f"job {job} already runs on 2 node(s), the most --nnodes 2 allows" in refused[0]
    assert not os.path.exists(os.path.join(str(tmp_path), "log-n2", "workerlog.0"))  # no worker was started
    running = [n.proc.poll() is None for n in nodes[:2]]
    logs = finish(nodes, *nodes[:2])
    report(test="f", refused_after_seconds=round(time.time() - started, 1), peers_running_at_refusal=running)
    assert "node restart" not in logs and "ptrain: restart" not in logs, logs[-8000:]
    rows = progress(out)
    assert {r["world_size"] for r in rows} == {2} and len({r["pid"] for r in rows}) == 1  # rank 0 never restarted
    assert result(out)["global_step"] == steps
