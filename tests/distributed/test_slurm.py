"""Slurm for real (issue 32, item 8): a one-node cluster started by hand (munged, slurmctld, slurmd, a generated
slurm.conf in a temporary directory, no systemd) runs the two sbatch recipes of docs/how-to/preemption.md as
written there: SIGUSR1 -> every process exits 138 -> ptrain requeues the job -> the requeued job resumes from
the saved step, bitwise the uninterrupted run. Every daemon is stopped at the end.

The signal is sent with ``scancel --signal=USR1`` to what the recipe's ``--signal`` form reaches (``--batch``:
the batch shell, for ``B:``; the steps' tasks otherwise), right after the first checkpoint: Slurm sends the
same signal to the same processes at the time limit, but only checks it about every 30 s. A requeued job that
Slurm holds (``PENDING``, reason ``BeginTime``, up to two minutes) is released with ``scontrol update
StartTime=now+5`` (at ``now``, slurmd can refuse the new credential as revoked: the job then fails).
"""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, free_port

pytestmark = pytest.mark.timeout(900)
from patience import patience

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue")
STEPS = 2000
TRAIN = f"--max_steps {STEPS} --evaluation_strategy no --report_to jsonl"


def _why_not() -> str:
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd "
                "slurm-client munge (Debian; .ci/run does as root)")
    if os.geteuid() != 0:
        return "a one-node Slurm cluster needs root here (munged and slurmd run as root)"
    return ""


WHY_NOT = _why_not()


def recipe(form: str) -> str:
    """The sbatch script of docs/how-to/preemption.md for ``form``, training digits briefly instead of ernie."""
    with open(os.path.join(REPO, "docs", "how-to", "preemption.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), flags=re.S)
    marker = "#SBATCH --signal=B:USR1@" if form == "batch-shell" else "#SBATCH --signal=USR1@"
    (script,) = [b for b in blocks if marker in b]
    line = 'ptrain run ernie --output_dir "$SCRATCH/run"'
    assert script.count(line) == 1, script
    return script.replace(line, f'"{sys.executable}" -m trainer.cli run digits --output_dir "$SCRATCH/run" {TRAIN}')


class Cluster:
    """munged, slurmctld and slurmd of a one-node cluster in ``root`` (their own ports, state and sockets)."""

    def __init__(self, root: str):
        self.root, self.procs, self.started = root, [], time.time()
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf,
                        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for name in list(self.env):
            if name.startswith(("PTRAIN_", "PADDLE_", "SLURM_")) and name != "SLURM_CONF":
                self.env.pop(name)

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool"):
            os.makedirs(os.path.join(r, d))
        key = os.path.join(r, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(r, "munge.sock")
        self._daemon("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={sock}",
                                f"--pid-file={r}/munged.pid", f"--log-file={r}/munged.log", f"--seed-file={r}/seed"])
        conf = f"""ClusterName=ptest
SlurmctldHost={self.node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
MinJobAge=600
JobRequeue=1
NodeName={self.node} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as f:
            f.write(conf)
        time.sleep(0.5)  # munged's socket
        self._daemon("slurmctld", ["slurmctld", "-D", "-c", "-f", self.conf])
        self._daemon("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", self.node])
        self.wait(lambda: self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", "the node to be idle", 120)

    def _daemon(self, name, cmd):
        log = open(os.path.join(self.root, f"{name}.out"), "w")
        self.procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env), log))

    def run(self, *cmd, check=False):
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=patience(60), cwd=self.root)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def job(self, job_id: str) -> dict:
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)

    def wait(self, condition, what, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if condition():
                return
            for name, proc, _ in self.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}: {self.logs()}")
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: {self.logs()}")

    def logs(self) -> str:
        out = ""
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = os.path.join(self.root, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    out += f"\n--- {name}\n" + f.read()[-1500:]
        return out

    def stop(self) -> list:
        """Cancel every job, stop every daemon; return what was left running (nothing, or the assertion fails)."""
        if any(name == "slurmctld" and p.poll() is None for name, p, _ in self.procs):
            self.run("scancel", "--full", "--user", "root")
            deadline = time.time() + patience(60)
            while (self.run("squeue", "-h").stdout.strip() or self._steps()) and time.time() < deadline:
                time.sleep(0.5)  # a finished job's slurmstepd reports to slurmctld, then exits
        for name, proc, log in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=patience(30))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()
        left = self._steps()
        for p in left:
            p.kill()
        return [p.pid for p in left]

    def _steps(self) -> list:
        """The slurmstepd processes of this cluster's jobs (started since the cluster)."""
        return [p for p in psutil.process_iter(["name", "create_time"])
                if p.info["name"] == "slurmstepd" and p.info["create_time"] >= self.started - 1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    c = Cluster(str(tmp_path_factory.mktemp("slurm")))
    try:
        c.start()
        yield c
    finally:
        left = c.stop()
    assert left == [], f"slurmstepd left running: {left}"
    assert all(p.poll() is not None for _, p, _ in c.procs)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cluster):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", "--output_dir", str(out),
                           *TRAIN.split()], capture_output=True, text=True, env=cluster.env, timeout=patience(600), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def hashes(out) -> dict:
    """The sha256 of the final checkpoint's model and optimizer files, computed from the bytes on disk."""
    step = out / "checkpoints" / f"step-{STEPS}"
    return {name: hashlib.sha256((step / name).read_bytes()).hexdigest()
            for name in ("model.safetensors", "optimizer.safetensors")}


@pytest.mark.parametrize("form", ["srun", "batch-shell"])
def test_the_documented_sbatch_recipe_is_preempted_requeued_and_resumes_exactly(tmp_path, cluster, uninterrupted,
                                                                                form):
    script = tmp_path / "job.sh"
    script.write_text(recipe(form))
    log = tmp_path / "job.out"
    cluster.env["SCRATCH"] = str(tmp_path)
    out = tmp_path / "run"
    job = cluster.run("sbatch", "--parsable", f"--output={log}", f"--job-name=ptrain-{form}", str(script),
                      check=True).stdout.strip().split(";")[0]
    cluster.wait(lambda: (out / "checkpoints" / "latest").exists(), "the first checkpoint")
    # what Slurm does at the time limit, now: --signal=B:USR1 -> the batch shell; --signal=USR1 -> the step's tasks
    cluster.run("scancel", "--signal=USR1", *(["--batch"] if form == "batch-shell" else []), job, check=True)
    cluster.wait(lambda: cluster.job(job).get("Restarts") == "1", "the requeue")
    text = log.read_text(errors="replace")
    preempted = re.search(r"ptrain: preempted at step (\d+); checkpoint \S+ of step \1 is saved and verifies: "
                          r"requeue the job \(exit 138", text)
    assert preempted and f"ptrain: requeueing Slurm job {job} (scontrol requeue {job})" in text, text[-3000:]
    at = int(preempted[1])
    assert 0 < at < STEPS
    if cluster.job(job).get("JobState") == "PENDING":  # (Slurm may hold a requeued job ~2 min: BeginTime)
        # lift the hold, a few seconds on: slurmd refuses a credential made in the second it revoked the job's
        # last one ("Job credential revoked", the job then FAILED), which is why Slurm holds a requeued job
        cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now+5")
    cluster.wait(lambda: cluster.job(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                              "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"),
                 "the requeued job to end", 600)
    info = cluster.job(job)
    text = log.read_text(errors="replace")
    resumed = f"resume auto: resuming from {out}/checkpoints/step-{at} "
    assert resumed in text and info.get("ExitCode") == "0:0" and info.get("Restarts") == "1", text[-3000:]
    assert text.count("ptrain: requeueing Slurm job") == 1
    assert json.loads((out / "results.json").read_text())["global_step"] == STEPS
    assert hashes(out) == hashes(uninterrupted)  # bitwise the run without the interruption
    lines = [line for line in text.splitlines() if re.search(r"SIGUSR1|preempted|requeue|resum|CANCELLED", line)]
    print(f"\n[{form}] job {job}:\n  " + "\n  ".join(lines))
