"""Every command the docs show runs as written (tests/docs/doc_commands.py finds them in the Markdown).

Each documented command has a plan in ``PLANS``; a command added to the docs without one fails
``test_every_documented_command_has_a_plan``, naming its file and line, and so does a plan whose command
left the docs. The plans:

- ``Run``: run as written (``bash -c``, so quotes and ``$VARS`` act as in a shell) in a scratch directory,
  with only documented shrinking flags appended to ``ptrain run`` (``SHRINK``: a few steps, a tiny model);
  exit 0, and a closing line that names only files the run left. Commands that need a trained run
  (``predict``, ``inspect``, a resume) get a copy of one small run per task, made once for the module by the
  documented ``ptrain run TASK`` itself; the inputs a reader brings (``my_digit.png``, ``train.py`` = the
  README's example) are made in the scratch directory.
- ``Server``: started as written on a port of its own (``--port``), waited for until ready, asked once, stopped.
- ``Refused``: needs what a CPU build lacks (GPUs, a layout gloo cannot run): exit 2 and one line on stderr
  naming the flag, before anything is launched.
- ``Cluster``: needs other hosts (an etcd server at 10.0.0.1, nodes to join): not run; its flags are
  checked against ``ptrain``'s parser.
- ``Bench``: a benchmark that measures for minutes: not run; its flags are checked against its ``--help``.
- ``PaddleFormers``: needs paddleformers, which cannot share this environment with paddlenlp: run as written by
  the named test of the PaddleFormers environment (``tests/paddleformers/``), which runs its page.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np
import pytest
from doc_commands import documented_commands
from helpers import REPO, free_port
from patience import patience

ERNIE_TINY = ["--hidden_size", "16", "--num_hidden_layers", "1", "--num_attention_heads", "2",
              "--intermediate_size", "32", "--max_seq_len", "24"]
#: documented flags that make a task's run small: appended to every `ptrain run TASK ...`
SHRINK: Dict[str, list] = {
    "digits": ["--num_train_epochs", "1"],
    "ernie": ["--max_steps", "2", *ERNIE_TINY],
    "resnet50": ["--max_steps", "2", "--per_device_train_batch_size", "8"],
}
#: the run a task's state is made by (the documented command, shrunk), and the folder it writes
STATE_RUNS = {"digits": "runs/digits-demo", "ernie": "runs/ernie-demo", "resnet50": "runs/resnet-demo"}


class Run(NamedTuple):
    state: Tuple[str, ...] = ()           # the tasks whose trained run the command reads
    subst: Tuple[Tuple[str, str], ...] = ()  # what the reader's own placeholders become here
    check: Optional[str] = None           # the name of one more check (CHECKS)
    needs: Tuple[str, ...] = ()           # modules of an extra the docs say to install beside the command


class Server(NamedTuple):
    kind: str                             # serve | visualdl
    state: Tuple[str, ...] = ("digits",)
    flags: Tuple[str, ...] = ()           # e.g. a runtime


class Refused(NamedTuple):
    flag: str
    subst: Tuple[Tuple[str, str], ...] = ()


class Cluster(NamedTuple):
    needs: str


class Bench(NamedTuple):
    why: str


class PaddleFormers(NamedTuple):
    test: str  # the test of the PaddleFormers environment (tests/paddleformers/) that runs the page as written


TASK_IS_DIGITS = (("TASK", "digits"),)
PLANS = {
    "ptrain list": Run(),
    "ptrain run digits": Run(),
    "ptrain run digits --dry_run": Run(check="writes_nothing"),
    "ptrain run resnet50 --nproc 2": Run(),
    "ptrain run ernie --learning_rate 1e-3": Run(),
    "ptrain run digits --resume_from_checkpoint auto": Run(state=("digits",)),
    "ptrain inspect runs/digits-demo": Run(state=("digits",)),
    "ptrain predict digits --model runs/digits-demo/inference my_digit.png": Run(state=("digits",), check="predicts"),
    "ptrain serve runs/digits-demo/inference": Server("serve"),
    "ptrain launch --nproc 2 --max_restarts 3 train.py": Run(),
    "ptrain visualdl --logdir runs/digits-demo": Server("visualdl"),
    "ptrain run digits --report_to tqdm,tensorboard": Run(check="tensorboard_beside_jsonl", needs=("tensorboardX",)),
    "ptrain run digits --learning_rate 0.01 --output_dir runs/digits-lr": Run(),
    "ptrain run digits --nproc 2 --overwrite_output_dir true": Run(state=("digits",)),
    "ptrain visualdl --logdir runs/digits-demo --port 8040": Server("visualdl"),
    "ptrain launch --nproc 8 --master etcd://10.0.0.1:2379 --job_id bert-42 --nnodes 2:4 --max_restarts 10 train.py "
    "--output_dir /shared/runs/bert-42": Cluster("an etcd server at 10.0.0.1 and 2 to 4 nodes"),
    "ptrain run ernie --nproc 8 --master etcd://10.0.0.1:2379 --job_id ernie-7 --nnodes 2 --max_restarts 5 "
    "--output_dir /shared/runs/ernie-7": Cluster("an etcd server at 10.0.0.1 and 2 nodes"),
    "ptrain predict digits --model runs/digits-demo/inference my_digit.png digit.npy": Run(state=("digits",), check="predicts"),
    "ptrain run resnet50": Run(),
    "ptrain predict resnet50 --model runs/resnet-demo/inference my_digit.png": Run(state=("resnet50",), check="predicts"),
    "ptrain run ernie": Run(),
    'ptrain predict ernie --model runs/ernie-demo/inference "这个手机很好用" "质量太差了，很失望"': Run(state=("ernie",), check="predicts"),
    "python -m benchmarks memory": Bench("every layout, a few minutes"),
    "python -m benchmarks memory --full": Bench("ERNIE base on every layout"),
    "python -m benchmarks memory --find-largest --modes dp,stage3+recompute": Bench("a search of many runs"),
    "ptrain run ernie --nproc 2 --per_device_train_batch_size 64 --auto_find_batch_size true": Run(),
    "ptrain run ernie --nproc 2 --tensor_parallel_degree 2": Refused("--tensor_parallel_degree"),
    "ptrain run digits --nproc 2": Run(),
    "ptrain run TASK --gpus 0,1,2,3": Refused("--gpus", TASK_IS_DIGITS),
    "ptrain run TASK --gpus 0,1,2,3 --ips 10.0.0.1,10.0.0.2": Refused("--gpus", TASK_IS_DIGITS),
    "ptrain run TASK --gpus 0,1,2,3 --nnodes 2 --master 10.0.0.1:8090 --rank 0": Refused("--gpus", TASK_IS_DIGITS),
    "ptrain run ernie --nproc 2 --pipeline_parallel_degree 2 --gradient_accumulation_steps 4":
        Refused("--pipeline_parallel_degree"),
    # the Slurm script's step (srun needs a cluster: the command it starts runs here)
    'srun ptrain run ernie --output_dir "$SCRATCH/run" --resume_from_checkpoint auto': Run(subst=(("srun ", ""),)),
    'ptrain run ernie --output_dir "$SCRATCH/run" --resume_from_checkpoint auto': Run(),
    "ptrain serve runs/digits-demo/inference runs/ernie-demo/inference": Server("serve", ("digits", "ernie")),
    "ptrain serve digits=runs/a/inference digits-big=runs/b/inference": Server("serve"),
    "ptrain serve model_repository/": Server("serve"),
    "ptrain serve runs/digits-demo/inference --runtime onnxruntime": Server("serve"),
    "ptrain inspect runs/lora": PaddleFormers("tests/paddleformers/test_pf_lora.py"),
}

DOCUMENTED = documented_commands()
UNIQUE = sorted({c.text for c in DOCUMENTED})


def test_every_documented_command_has_a_plan():
    assert len(UNIQUE) >= 30, UNIQUE  # the extraction cannot silently stop finding them
    missing = [f"{c.where}: {c.text}" for c in DOCUMENTED if c.text not in PLANS]
    assert not missing, "documented commands with no plan in tests/docs/test_doc_commands.py:\n" + "\n".join(missing)
    stale = sorted(set(PLANS) - set(UNIQUE))
    assert not stale, f"plans for commands the docs no longer show: {stale}"


def _ids(kind):
    """The commands of a kind, one per command line actually run (the Slurm step is the batch shell's command)."""
    seen, out = set(), []
    for text in UNIQUE:
        plan = PLANS.get(text)
        if isinstance(plan, kind):
            line = _shell_line(text, getattr(plan, "subst", ()))
            if line not in seen:
                seen.add(line)
                out.append(text)
    return out


# ---- the scratch world ------------------------------------------------------------------------------------
def _env(scratch):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env["SCRATCH"] = str(scratch / "scratch")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _shell_line(text, subst=()):
    for old, new in subst:
        text = text.replace(old, new)
    words = text.split()
    if words[:2] == ["ptrain", "run"] and len(words) > 2 and words[2] in SHRINK and "--dry_run" not in words:
        text += " " + " ".join(SHRINK[words[2]])
    # `ptrain` as the console script does it, with this interpreter (a fresh venv has it on PATH)
    return re.sub(r"^ptrain ", f"{sys.executable} -m trainer.cli ", text)


def _run(text, cwd, subst=(), timeout=600):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(["bash", "-c", _shell_line(text, subst)], cwd=cwd, env=_env(cwd), capture_output=True,
                          text=True, timeout=patience(timeout))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"CPU {cpu:6.1f} s  {text}")  # what each command costs the suite (pytest -s shows it)
    return done


def _inputs(where):
    """What the reader brings: an 8x8 digit as a PNG and an .npy, and the README's example as train.py."""
    from PIL import Image
    from sklearn.datasets import load_digits

    x, _ = load_digits(return_X_y=True)
    Image.fromarray((x[0].reshape(8, 8) * 255 / 16).astype("uint8")).resize((32, 32)).save(where / "my_digit.png")
    np.save(where / "digit.npy", x[1].reshape(8, 8))
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    (where / "train.py").write_text(re.findall(r"^<!-- runnable -->\n```python\n(.*?)^```", readme, re.S | re.M)[0])
    (where / "scratch").mkdir(exist_ok=True)


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """One small trained run per task, made by the documented `ptrain run TASK` (shrunk), on first use."""
    made: Dict[str, object] = {}

    def get(task):
        if task not in made:
            where = tmp_path_factory.mktemp(f"state-{task}")
            made[task] = (where, _run(f"ptrain run {task}", where))
        return made[task]

    return get


def _scratch(tmp_path, states, needs):
    _inputs(tmp_path)
    for task in needs:
        where, done = states(task)
        assert done.returncode == 0, f"the run of {task} the command needs failed:\n{done.stderr[-3000:]}"
        shutil.copytree(where / STATE_RUNS[task], tmp_path / STATE_RUNS[task], symlinks=True)
    return tmp_path


def _closing_line_names_files_that_exist(done, cwd):
    for m in re.finditer(r"^run directory: (\S+) \((.*)\)$", done.stdout, re.M):
        folder, names = m.group(1), m.group(2).split(", ")
        assert "results.json" in names, m.group(0)
        for name in names:
            assert os.path.exists(os.path.join(folder, name.rstrip("/"))), f"the closing line names {name}: {m.group(0)}"


# ---- Run ----------------------------------------------------------------------------------------------------
def _check_writes_nothing(done, cwd):
    assert sorted(os.listdir(cwd)) == ["digit.npy", "my_digit.png", "scratch", "train.py"], os.listdir(cwd)
    assert "callbacks (order, name):" in done.stdout


def _check_predicts(done, cwd):
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows and all("label" in r for r in rows), done.stdout[-2000:]


def _check_tensorboard_beside_jsonl(done, cwd):
    run = cwd / "runs" / "digits-demo"
    assert (run / "metrics.jsonl").is_file() and (run / "tensorboard").is_dir() and not (run / "visualdl").exists()
    assert "metrics.jsonl" in done.stdout and "tensorboard/" in done.stdout


CHECKS = {"writes_nothing": _check_writes_nothing, "predicts": _check_predicts,
          "tensorboard_beside_jsonl": _check_tensorboard_beside_jsonl}


@pytest.mark.parametrize("text", _ids(Run))
def test_documented_command_runs(text, tmp_path, states):
    plan = PLANS[text]
    for module in plan.needs:  # the README's test set-up installs no tracker extra; .ci/run does, so CI runs it
        pytest.importorskip(module, reason=f"{module} (an extra the docs name beside this command) is not installed")
    words = text.split()
    if words[:2] == ["ptrain", "run"] and "--dry_run" not in words and words[2:] and words[2] in STATE_RUNS \
            and len(words) == 3:
        where, done = states(words[2])  # the state run is this very command: judged once, here
        cwd = where
    else:
        cwd = _scratch(tmp_path, states, plan.state)
        done = _run(text, cwd, plan.subst)
    assert done.returncode == 0, f"{text}\nexit {done.returncode}\n{done.stderr[-4000:]}"
    _closing_line_names_files_that_exist(done, cwd)
    if plan.check:
        CHECKS[plan.check](done, cwd)


# ---- Server -------------------------------------------------------------------------------------------------
def _repository(cwd):
    """The folders the several-models lines name: runs/a, runs/b and model_repository/NAME (the digits export)."""
    export = cwd / "runs" / "digits-demo" / "inference"
    for folder in (cwd / "runs" / "a" / "inference", cwd / "runs" / "b" / "inference", cwd / "model_repository" / "digits"):
        shutil.copytree(export, folder)


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


@pytest.mark.parametrize("text", _ids(Server))
def test_documented_server_starts_answers_and_stops(text, tmp_path, states):
    plan = PLANS[text]
    cwd = _scratch(tmp_path, states, plan.state)
    _repository(cwd)
    port = 0 if plan.kind == "serve" else free_port()
    line = _shell_line(text) + f" --port {port}" + (" --host 127.0.0.1" if plan.kind == "visualdl" else "")
    proc = subprocess.Popen(["bash", "-c", "exec " + line], cwd=cwd, env=_env(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    try:
        deadline = time.monotonic() + patience(240)
        if plan.kind == "serve":
            while time.monotonic() < deadline:
                got = proc.stdout.readline()
                out.append(got)
                m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", got)
                if m or (not got and proc.poll() is not None):
                    break
            assert m, "".join(out)[-3000:]
            base = f"http://127.0.0.1:{m.group(1)}"
            status, meta = _get(base + "/v2/models/digits")  # every line serves the digits export (as digits)
            assert status == 200
            name = json.loads(meta)["inputs"][0]["name"]
            body = json.dumps({"inputs": [{"name": name, "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})
            req = urllib.request.Request(f"{base}/v2/models/digits/infer", data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                answer = json.loads(r.read())
            assert r.status == 200 and answer["outputs"][0]["shape"] == [1, 10], answer
        else:
            base = f"http://127.0.0.1:{port}"
            while True:
                try:
                    status, page = _get(base + "/app/api/runs")
                    break
                except (urllib.error.URLError, ConnectionError, OSError):
                    assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
                    time.sleep(0.5)
            assert status == 200 and b"data" in page
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(patience(60))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()


# ---- Refused ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", _ids(Refused))
def test_documented_gpu_command_is_refused_in_one_line(text, tmp_path):
    plan = PLANS[text]
    (tmp_path / "scratch").mkdir()
    done = _run(text, tmp_path, plan.subst, timeout=180)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, f"{text}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert len(lines) == 1 and plan.flag.lstrip("-") in lines[0], done.stderr[-3000:]
    assert not list(tmp_path.rglob("launch_logs")) and not (tmp_path / "log").exists()  # nothing was launched


# ---- PaddleFormers: run in its environment (paddleformers and paddlenlp cannot share one) -------------------------
@pytest.mark.parametrize("text", _ids(PaddleFormers))
def test_documented_paddleformers_command_is_run_in_its_environment(text):
    from doc_commands import page_commands

    test = open(os.path.join(REPO, PLANS[text].test), encoding="utf-8").read()
    pages = {c.path for c in DOCUMENTED if c.text == text}
    # the test runs every documented command of the page(s) that show it (page_commands), as written
    assert all(f'"{page}"' in test for page in pages) and "page_commands(" in test, (text, pages)
    assert all(text in {c.text for c in page_commands(os.path.join(REPO, page))} for page in pages)


# ---- Cluster, Bench: not run, flags checked -------------------------------------------------------------------
@pytest.mark.parametrize("text", _ids(Cluster))
def test_documented_cluster_command_parses(text):
    from trainer.cli.parser import build_parser

    words = text.split()[1:]
    ns, extra = build_parser().parse_known_args(words)
    if ns.command == "run":
        from trainer.cli.run import resolve_run

        resolve_run(ns.task, ns.recipe, ns.config, extra)  # every --field is an argument or a task option
    else:
        assert not extra and os.path.basename(ns.script) == "train.py", (ns, extra)
    assert ns.master.startswith("etcd://") and ns.job_id and ns.max_restarts > 0


@pytest.mark.parametrize("text", _ids(Bench))
def test_documented_benchmark_flags_exist(text, capsys):
    from benchmarks import BENCHMARKS

    words = text.split()[3:]
    module = __import__(BENCHMARKS[words[0]], fromlist=["main"])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    usage = capsys.readouterr().out
    for flag in [w for w in words[1:] if w.startswith("--")]:
        assert flag in usage, flag
    if "--modes" in words:
        modes = words[words.index("--modes") + 1].split(",")
        assert set(modes) <= set(module.MODES), modes
