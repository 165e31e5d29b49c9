"""ptrain launch: the launcher flags, the restart loop and the resume signal, without etcd."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

from trainer.cli import main
from trainer.cli.parser import build_parser as _parser
from trainer.launch.restarts import launch_command

ENV = dict(os.environ, PYTHONPATH=REPO)
# the first run fails once every rank has started (the launcher then stops the others: a rank it stopped before its
# first line would count its relaunch as its first run, which a loaded machine made happen); relaunched, it succeeds
FLAKY = '''import os, sys, time
marker = os.path.join(sys.argv[1], "started-" + os.environ["PADDLE_TRAINER_ID"])
first = not os.path.exists(marker)
open(marker, "a").write(os.environ.get("PTRAIN_RESUME", "-") + "\\n")
deadline = time.time() + 120
ranks = int(os.environ["PADDLE_TRAINERS_NUM"])
while first and time.time() < deadline and not all(
        os.path.exists(os.path.join(sys.argv[1], f"started-{r}")) for r in range(ranks)):
    time.sleep(0.05)
sys.exit(int(sys.argv[2]) if first else 0)
'''


def ptrain(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("flags, message", [
    (["--nnodes", "1:2", "--master", "127.0.0.1:8090"], "MIN:MAX needs an etcd master"),
    (["--nnodes", "2:1"], "--nnodes=2:1 is not allowed"),
    (["--master", "etcd://127.0.0.1:2379"], "needs --job_id"),
    (["--master", "etcd://nowhere"], "give etcd://HOST:PORT"),
    (["--elastic_timeout", "2"], "give 6 or more seconds"),
    (["--max_restarts", "-1"], "give 0 or more restarts"),
])
def test_bad_launcher_flags_fail_with_one_line_and_code_2(tmp_path, capsys, flags, message):
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["launch", *flags, str(script)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_run_and_launch_share_the_launcher_flags():
    run = _parser().parse_args(["run", "digits", "--nnodes", "1:2", "--master", "etcd://h:1", "--job_id", "j",
                                "--elastic_timeout", "9", "--log_dir", "L", "--max_restarts", "3"])
    launch = _parser().parse_args(["launch", "--nnodes", "1:2", "--master", "etcd://h:1", "--job_id", "j",
                                   "--elastic_timeout", "9", "--log_dir", "L", "--max_restarts", "3", "x.py", "--lr", "1"])
    keys = ("nproc", "gpus", "ips", "nnodes", "master", "rank", "job_id", "max_restarts", "elastic_timeout", "log_dir")
    assert {k: getattr(run, k) for k in keys} == {k: getattr(launch, k) for k in keys}
    assert launch.script == "x.py" and launch.script_args == ["--lr", "1"]
    cmd = launch_command(launch, ["x.py"], "L", internal_restarts=3)
    assert cmd[1].endswith(os.path.join("launch", "elastic.py"))  # the etcd client's protobuf setting, launcher process only
    assert cmd[cmd.index("--elastic_level") + 1] == "0" and cmd[cmd.index("--max_restart") + 1] == "2"
    assert cmd[cmd.index("--nnodes") + 1] == "1:2" and cmd[cmd.index("--job_id") + 1] == "j"


def test_launch_restarts_a_failed_script_which_is_told_to_resume(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    done = ptrain("launch", "--nproc", "2", "--max_restarts", "2", "--log_dir", str(tmp_path / "logs"),
                  str(script), str(tmp_path), "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ptrain: restart 1 of 2 from the latest checkpoint" in done.stderr
    assert "restart 2 of 2" not in done.stderr
    for rank in (0, 1):  # PTRAIN_RESUME=auto on the relaunch only (an etcd job: from the start): Trainer.fit resumes
        assert (tmp_path / f"started-{rank}").read_text().split() == ["-", "auto"]


def test_launch_never_restarts_a_configuration_error(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    done = ptrain("launch", "--nproc", "2", "--max_restarts", "2", "--log_dir", str(tmp_path / "logs"),
                  str(script), str(tmp_path), "2")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "ptrain: restart" not in done.stderr and "no restart can fix it" in done.stderr


def test_a_restarted_job_resumes_from_its_newest_checkpoint_not_the_one_it_started_from(tmp_path, monkeypatch):
    from trainer.checkpoint.resume import resume_after_restart

    out = str(tmp_path)
    monkeypatch.delenv("PTRAIN_RESUME", raising=False)
    assert resume_after_restart("/pretrained/step-9", out) == "/pretrained/step-9"
    monkeypatch.setenv("PTRAIN_RESUME", "auto")
    assert resume_after_restart("/pretrained/step-9", out) == "/pretrained/step-9"  # nothing saved yet: as asked
    assert resume_after_restart(None, out) is None  # a fresh start
    (tmp_path / "checkpoints" / "step-4").mkdir(parents=True)
    assert resume_after_restart("/pretrained/step-9", out) == "auto"
    assert resume_after_restart(None, out) == "auto"


def test_an_unreachable_etcd_master_stops_with_one_clear_line(tmp_path, capsys):
    from helpers import free_port

    script = tmp_path / "s.py"
    script.write_text("")
    master = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["launch", "--master", f"etcd://{master}", "--job_id", "j", "--elastic_timeout", "6", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the etcd master {master} is unreachable" in err and "start etcd" in err, err
