"""Ctrl-C of ``ptrain launch ... | tee log`` and of ``ptrain launch ... | head -1`` (issue 39 item 3): the shell
sends SIGINT to the whole pipeline, the reader dies first, ptrain's console is a closed pipe. The save still
happens, ptrain exits 130, the run lock is released, no process of the job is left, what could not reach the
console is in LOG_DIR/console.log, and a resume continues from the saved step. Real readers (``tee``,
``head``), real signals to a real process group, a real 2-process launch."""

import os
import re
import signal
import subprocess
import sys
import time

from helpers import free_port, preemption_env
from job_tree import assert_all_gone, latest_checkpoint, tree
from patience import patience

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
TOY = os.path.join(WORKERS, "preempt_toy.py")

PTRAIN = [sys.executable, "-m", "trainer.cli"]


def as_a_shell_starts_it():
    """A terminal's shell starts each command of a pipeline with SIGINT and SIGQUIT at their defaults. The suite
    itself may run with SIGINT ignored (started as ``cmd &`` by a script, which ignores it in the background job),
    and an ignored signal stays ignored across exec: ``tee`` would outlive the Ctrl-C these tests send (seen: the
    README's suite started that way, both tee tests timed out)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def console(tmp_path):
    path = tmp_path / "logs" / "console.log"
    return path.read_text(errors="replace") if path.exists() else "(no console.log)"


def launch_into(reader, tmp_path, out, steps, *extra):
    """``ptrain launch --nproc 2 TOY OUT STEPS | READER`` with stdout and stderr in the pipe, ptrain and the reader
    in one new process group (as a shell's pipeline is)."""
    sink = subprocess.Popen(reader, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, process_group=0,
                            cwd=tmp_path, preexec_fn=as_a_shell_starts_it)
    proc = subprocess.Popen(PTRAIN + ["launch", "--nproc", "2", "--master", f"127.0.0.1:{free_port()}", "--log_dir",
                                      str(tmp_path / "logs"), TOY, out, str(steps), *extra],
                            stdout=sink.stdin, stderr=sink.stdin, env=preemption_env(), cwd=tmp_path, process_group=sink.pid,
                            preexec_fn=as_a_shell_starts_it)
    sink.stdin.close()  # the pipeline's only reader is the reader
    return proc, sink


def wait_for(predicate, proc, what):
    deadline = time.time() + patience(180)
    while not predicate():
        assert proc.poll() is None, f"ptrain ended early ({proc.returncode}) waiting for {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ctrl_c(proc, sink):
    """What the shell does on Ctrl-C: SIGINT to the pipeline's process group; the reader (tee) dies first."""
    if sink.poll() is None:
        os.kill(sink.pid, signal.SIGINT)
        sink.wait(timeout=patience(30))
    os.killpg(sink.pid, signal.SIGINT)
    proc.wait(timeout=patience(120))


def kill_left(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()


def ctrl_c_through_closed_pipe(tmp_path, reader):
    out = str(tmp_path / "out")
    os.makedirs(out)
    proc, sink = launch_into(reader, tmp_path, out, 100000)
    try:
        wait_for(lambda: os.path.exists(os.path.join(out, "at-20-rank1")), proc, "step 20")
        procs = tree(proc.pid)
        ctrl_c(proc, sink)
    finally:
        kill_left(proc, sink)
    assert proc.returncode == 130, console(tmp_path)[-3000:]
    step = latest_checkpoint(out)  # verified: every file matches its manifest
    assert step > 20
    assert not os.path.exists(os.path.join(out, ".ptrain.lock"))
    assert_all_gone(procs, timeout=patience(30))
    shown = console(tmp_path)
    assert "ptrain: SIGINT: stopping the job" in shown  # what the closed pipe could not show is on disk
    assert "Container failed" not in shown.split("ptrain: SIGINT")[0]
    return out, step


def resume_continues(tmp_path, out, step):
    done = subprocess.run(PTRAIN + ["launch", "--nproc", "2", "--master", f"127.0.0.1:{free_port()}", "--log_dir",
                                    str(tmp_path / "logs2"), TOY, out, str(step + 10), "resume"],
                          env=preemption_env(), cwd=tmp_path, capture_output=True, text=True, timeout=patience(300), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "logs2" / "workerlog.0").read_text(errors="replace")
    assert re.search(rf"resuming from \S*step-{step}\b", log), log[-3000:]
    assert os.path.exists(os.path.join(out, "final-rank0-completed.npz"))


def test_ctrl_c_of_ptrain_launch_piped_into_tee_saves_exits_130_and_resumes(tmp_path):
    out, step = ctrl_c_through_closed_pipe(tmp_path, ["tee", str(tmp_path / "tee.log")])
    resume_continues(tmp_path, out, step)


def test_ctrl_c_of_ptrain_launch_piped_into_head_saves_and_exits_130(tmp_path):
    ctrl_c_through_closed_pipe(tmp_path, ["head", "-1"])


def test_a_job_piped_into_head_completes_with_exit_0(tmp_path):
    """The reader closed the pipe after the first line and nobody signals: the job is not a failure (no 120 from an
    interpreter's last flush into the closed pipe, no restart)."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    proc, sink = launch_into(["head", "-1"], tmp_path, out, 60)
    procs = []
    try:
        wait_for(lambda: sink.poll() is not None, proc, "head to exit")
        procs = tree(proc.pid)
        proc.wait(timeout=patience(300))
    finally:
        kill_left(proc, sink)
    assert proc.returncode == 0, console(tmp_path)[-3000:]
    assert os.path.exists(os.path.join(out, "final-rank0-completed.npz"))
    assert_all_gone(procs, timeout=patience(30))
    assert f"ptrain: the job completed; the workers' logs and this console are in {tmp_path / 'logs'}" in console(tmp_path)


def test_a_preempted_job_shows_no_launcher_failure_and_names_its_logs(tmp_path):
    """Paddle's launcher logs "LAUNCH ERROR ... Container failed !!!" for a rank that exited 130 and repeats the tail
    of its log: after a preemption both stay off ptrain's console and are kept in console.log (issue 39 item 7)."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    proc = subprocess.Popen(PTRAIN + ["launch", "--nproc", "2", "--master", f"127.0.0.1:{free_port()}", "--log_dir",
                                      str(tmp_path / "logs"), TOY, out, "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=preemption_env(), cwd=tmp_path, text=True)
    try:
        wait_for(lambda: os.path.exists(os.path.join(out, "at-20-rank1")), proc, "step 20")
        proc.send_signal(signal.SIGINT)
        shown, _ = proc.communicate(timeout=patience(120))
    finally:
        kill_left(proc)
    assert proc.returncode == 130, shown[-3000:]
    kept = console(tmp_path)
    assert "Container failed" in kept and "code 130" in kept  # the launcher's own words, on disk
    assert "Container failed" not in shown and "LAUNCH ERROR" not in shown, shown[-3000:]
    assert shown.count("preempted by SIGINT at step") <= 1, shown[-3000:]  # the launcher's repeat of the log tail
    assert shown.strip().splitlines()[-1].endswith(f"the workers' logs and this console are in {tmp_path / 'logs'}")


def test_ctrl_c_of_one_process_ptrain_run_piped_into_tee_exits_130(tmp_path):
    """No launcher: the training process itself writes into the pipe (the progress bar, the preemption's lines)."""
    out = tmp_path / "run"
    sink = subprocess.Popen(["tee", str(tmp_path / "tee.log")], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            process_group=0, preexec_fn=as_a_shell_starts_it)
    proc = subprocess.Popen(PTRAIN + ["run", "digits", "--output_dir", str(out), "--max_steps", "100000",
                                      "--logging_steps", "5", "--report_to", "jsonl", "--evaluation_strategy", "no",
                                      "--save_steps", "100000"],
                            stdout=sink.stdin, stderr=sink.stdin, env=preemption_env(), cwd=tmp_path, process_group=sink.pid,
                            preexec_fn=as_a_shell_starts_it)
    sink.stdin.close()
    try:
        metrics = out / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, proc, "step 15")
        ctrl_c(proc, sink)
    finally:
        kill_left(proc, sink)
    assert proc.returncode == 130  # was 1: BrokenPipeError from the progress bar's write
    assert latest_checkpoint(str(out)) >= 15
    assert not (out / ".ptrain.lock").exists()
