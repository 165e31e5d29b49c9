"""Rank0Logger for real: metrics.jsonl, VisualDL records (read back by VisualDL's
own reader and by its HTTP server), the PNG, the bar, two processes."""

import doctest
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request

import numpy as np
import paddle
import pytest
from helpers import REPO, ToyDataset, free_port, launch, make_mlp
from patience import patience

import callbacks.logger
import callbacks.plots
from callbacks import Rank0Logger
from trainer import Trainer, TrainingArguments

TRAIN_KEYS = {"step", "epoch", "loss", "learning_rate", "samples_per_second"}
EVAL_KEYS = {"step", "eval_loss", "eval_accuracy", "eval_samples", "eval_runtime", "eval_samples_per_second",
             "eval_steps_per_second"}
MONITOR_KEYS = {"data_wait_share", "cpu_percent", "rss_mb"}  # GPUUtilizationMonitor, when in the set


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def make_trainer(out, max_steps=6, report_to=("jsonl", "visualdl", "png"), **kw):
    values = dict(output_dir=str(out), max_steps=max_steps, logging_steps=2, per_device_train_batch_size=8,
                  learning_rate=0.01, evaluation_strategy="steps", eval_steps=3, save_strategy="no",
                  report_to=list(report_to))
    values.update(kw)
    return Trainer(make_mlp(), TrainingArguments(**values), train_dataset=ToyDataset(64),
                   eval_dataset=ToyDataset(24, seed=1), loss_fn=paddle.nn.CrossEntropyLoss(), compute_metrics=accuracy)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def kinds(records):
    return [(r["step"], "eval" if "eval_loss" in r else "train") for r in records]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    trainer = make_trainer(out)
    trainer.fit()
    return out, trainer


# ---- (a) metrics.jsonl and the VisualDL record of a real run -------------------------
def test_metrics_jsonl_holds_every_record_once(finished):
    out, trainer = finished
    records = read_jsonl(out / "metrics.jsonl")
    assert kinds(records) == [(2, "train"), (3, "eval"), (4, "train"), (6, "train"), (6, "eval")]
    assert records == trainer.state.log_history  # finite floats round-trip exactly
    for r in records:
        if "loss" in r:
            assert TRAIN_KEYS <= set(r) and set(r) - TRAIN_KEYS <= MONITOR_KEYS, sorted(r)
            assert np.isfinite(r["loss"]) and r["samples_per_second"] > 0
        else:
            assert set(r) == EVAL_KEYS and r["eval_samples"] == 24


def test_visualdl_record_holds_the_scalars_and_no_hparams(finished):
    from visualdl import LogReader

    out, _ = finished
    files = glob.glob(str(out / "visualdl" / "vdlrecords.*.log"))
    assert len(files) == 1
    reader = LogReader(file_path=files[0])
    tags = reader.get_tags()
    assert set(tags) <= {"scalar", "meta_data"}  # in particular no hyper_parameters record
    assert {"train/loss", "train/learning_rate", "train/samples_per_second", "eval/loss", "eval/accuracy"} <= set(tags["scalar"])
    assert not {"train/step", "train/epoch", "eval/samples"} & set(tags["scalar"])
    records = read_jsonl(out / "metrics.jsonl")
    for tag, key in (("train/loss", "loss"), ("eval/accuracy", "eval_accuracy")):
        points = [(v.id, v.value) for v in reader.get_data("scalar", tag)]
        want = [(r["step"], r[key]) for r in records if key in r]
        assert [s for s, _ in points] == [s for s, _ in want]
        np.testing.assert_allclose([v for _, v in points], [v for _, v in want], rtol=1e-6)  # stored as float32


def vdl_points(out, tag):
    """(step, value) of ``tag`` in the one record file VisualDL would show for ``out``."""
    from visualdl import LogReader

    files = glob.glob(str(out / "visualdl" / "vdlrecords.*"))
    assert len(files) == 1, files
    return [(v.id, v.value) for v in LogReader(file_path=files[0]).get_data("scalar", tag)]


def test_resumed_run_keeps_one_history_up_to_the_checkpoint_and_fresh_run_starts_over(tmp_path):
    make_trainer(tmp_path, save_strategy="steps", save_steps=3).fit()
    first = read_jsonl(tmp_path / "metrics.jsonl")
    # resume at step 3 (within the same second: the new VisualDL file must not overwrite the old one)
    resumed = make_trainer(tmp_path, save_strategy="no")
    resumed.fit(resume_from_checkpoint=str(tmp_path / "checkpoints" / "step-3"))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert kinds(records) == [(2, "train"), (3, "eval"), (4, "train"), (6, "train"), (6, "eval")]
    assert records[:2] == first[:2]  # the records before the checkpoint are the first run's
    loss = vdl_points(tmp_path, "train/loss")
    assert [step for step, _ in loss] == [2, 4, 6]
    np.testing.assert_allclose([v for _, v in loss], [r["loss"] for r in records if "loss" in r], rtol=1e-6)
    assert [step for step, _ in vdl_points(tmp_path, "eval/accuracy")] == [3, 6]
    # a fresh run into the same directory starts a new history
    make_trainer(tmp_path, max_steps=2, evaluation_strategy="no", overwrite_output_dir=True).fit()
    assert kinds(read_jsonl(tmp_path / "metrics.jsonl")) == [(2, "train")]
    assert [step for step, _ in vdl_points(tmp_path, "train/loss")] == [2]


def test_a_second_fit_of_the_same_trainer_continues_the_history(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, evaluation_strategy="no")
    trainer.fit()
    trainer.args.max_steps = 4
    trainer.fit()
    assert kinds(read_jsonl(tmp_path / "metrics.jsonl")) == [(2, "train"), (4, "train")]
    assert [step for step, _ in vdl_points(tmp_path, "train/loss")] == [2, 4]


def test_evaluate_after_fit_appends_to_metrics_jsonl(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, evaluation_strategy="no", report_to=["jsonl", "visualdl"])
    trainer.fit()
    metrics = trainer.evaluate()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert kinds(records) == [(2, "train"), (2, "eval")]
    assert records[-1]["eval_accuracy"] == metrics["eval_accuracy"]
    assert len(glob.glob(str(tmp_path / "visualdl" / "vdlrecords.*.log"))) == 1


def test_non_finite_values_are_written_as_null(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, evaluation_strategy="no", report_to=["jsonl"])
    logger = trainer.callbacks.get(Rank0Logger)
    logger.on_fit_begin(trainer)
    trainer.log({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "loss_scale": np.float32(1024.0)})
    logger.on_fit_end(trainer)
    with open(tmp_path / "metrics.jsonl") as f:
        line = f.read()
    assert json.loads(line) == {"step": 1, "loss": None, "grad_norm": None, "loss_scale": 1024.0}
    assert "NaN" not in line and "Infinity" not in line


def test_progress_bar_shows_loss_lr_and_throughput(tmp_path, capsys, monkeypatch):
    import callbacks.logger

    monkeypatch.setattr(callbacks.logger, "_is_terminal", lambda stream: True)  # capsys' stderr is no terminal
    make_trainer(tmp_path, report_to=["tqdm"], evaluation_strategy="no").fit()
    err = capsys.readouterr().err
    assert "6/6" in err and "loss=" in err and "lr=" in err and "samples/s=" in err
    # report_to names what is written beside metrics.jsonl, the run's own record: no VisualDL here
    assert os.path.exists(tmp_path / "metrics.jsonl") and not os.path.exists(tmp_path / "visualdl")


def test_stderr_not_a_terminal_gets_one_line_per_logging_step_and_no_redraws(tmp_path):
    """CI logs, Slurm, nohup: a real child process whose stderr is a file."""
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
            "import paddle; from helpers import ToyDataset, make_mlp\n"
            "from trainer import Trainer, TrainingArguments\n"
            "args = TrainingArguments(output_dir=sys.argv[2], max_steps=6, logging_steps=2, report_to=['tqdm'],\n"
            "                         evaluation_strategy='steps', eval_steps=6, save_strategy='no')\n"
            "t = Trainer(make_mlp(), args, train_dataset=ToyDataset(48), eval_dataset=ToyDataset(16),\n"
            "            loss_fn=paddle.nn.CrossEntropyLoss())\n"
            "t.fit(); t.evaluate()\n")
    with open(tmp_path / "err.log", "w") as err, open(tmp_path / "out.log", "w") as out:
        subprocess.run([sys.executable, "-c", code, REPO, str(tmp_path / "run")], stdout=out, stderr=err, check=True,
                       timeout=patience(300), cwd=REPO)
    text = (tmp_path / "out.log").read_text() + (tmp_path / "err.log").read_text()
    assert "\r" not in text and "it/s" not in text and "step/s" not in text  # no bar redraws
    steps = [line for line in text.splitlines() if line.startswith("step=") and " loss=" in line]
    assert [line.split()[0] for line in steps] == ["step=2", "step=4", "step=6"]
    evals = [line for line in text.splitlines() if "eval_loss=" in line]
    assert len(evals) == 1, evals  # the final evaluate() on the same weights does not repeat the step-6 line


# ---- (d) the PNG ------------------------------------------------------------------------
def test_png_of_the_curves_is_written_and_valid(finished):
    from PIL import Image

    out, _ = finished
    path = out / "curves.png"
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] >= 1000 and img.size[1] >= 300  # two panels


# ---- (c) what users see: the real VisualDL server ----------------------------------------
def _get_json(url):
    with urllib.request.urlopen(url, timeout=patience(10)) as resp:
        body = json.loads(resp.read().decode("utf-8"))
    assert body["status"] == 0, body
    return body["data"]


def _visualdl_command():
    exe = os.path.join(os.path.dirname(sys.executable), "visualdl")
    return [exe] if os.path.exists(exe) else [shutil.which("visualdl") or pytest.skip("no visualdl console script")]


def test_visualdl_server_serves_the_loss_curve(finished, tmp_path):
    out, _ = finished
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "visualdl-server.log", "wb") as log:
        server = subprocess.Popen(_visualdl_command() + ["--logdir", str(out), "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + patience(60)
        while True:
            try:
                with urllib.request.urlopen(base + "/alive", timeout=patience(2)) as resp:
                    if resp.status in (200, 204):
                        break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise AssertionError("visualdl server did not come up:\n" + (tmp_path / "visualdl-server.log").read_text())
            time.sleep(0.3)
        runs = _get_json(base + "/app/api/runs")
        assert len(runs) == 1 and runs[0].endswith("visualdl")
        tags = _get_json(base + "/app/api/scalar/tags")
        assert "train/loss" in tags["tags"][0] and "eval/accuracy" in tags["tags"][0]
        query = urllib.parse.urlencode({"run": runs[0], "tag": "train/loss"})
        curve = _get_json(f"{base}/app/api/scalar/list?{query}")  # [[wall time ms, step, value], ...]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=patience(10))
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    want = [(r["step"], r["loss"]) for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert [int(step) for _, step, _ in curve] == [s for s, _ in want]
    np.testing.assert_allclose([v for _, _, v in curve], [v for _, v in want], rtol=1e-6)


# ---- (b) two processes: one writer, the loss averaged over ranks ---------------------------
SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import paddle
    from callbacks import Callback, GPUUtilizationMonitor
    from trainer import Trainer, TrainingArguments

    class Data(paddle.io.Dataset):
        def __init__(self):
            rng = np.random.RandomState(0)
            self.x = rng.randn(48, 8).astype("float32")
            self.y = (self.x.sum(1) > 0).astype("int64")
        def __len__(self):
            return len(self.y)
        def __getitem__(self, i):
            return self.x[i], self.y[i]

    class LocalLoss(Callback):
        """Each rank's own mean step loss over the logging window, next to the logged figures."""
        order = 95  # after the monitor (90), before the logger (100)
        def __init__(self):
            self.sum, self.n, self.rows = None, 0, []
        def on_step_end(self, trainer):
            loss = trainer.state.step_loss
            self.sum = loss if self.sum is None else self.sum + loss   # stays on the device
            self.n += 1
        def on_log(self, trainer):
            if "loss" in trainer.state.logs:
                logs = trainer.state.logs
                self.rows.append([logs["step"], float(self.sum) / self.n, logs["loss"], logs["data_wait_share"]])
                self.sum, self.n = None, 0

    out = sys.argv[1]
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))
    args = TrainingArguments(output_dir=out, max_steps=6, logging_steps=2, per_device_train_batch_size=4,
                             learning_rate=0.05, evaluation_strategy="no", save_strategy="no",
                             report_to=["tqdm", "jsonl", "visualdl", "png"])
    local = LocalLoss()
    trainer = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[local])
    trainer.remove_callback(GPUUtilizationMonitor)  # the default one, if any: use a fast-sampling one
    trainer.add_callback(GPUUtilizationMonitor(interval=0.05))
    trainer.fit()
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    with open(os.path.join(out, "..", "local-rank" + rank + ".json"), "w") as f:
        json.dump(local.rows, f)
''')


def test_two_processes_write_one_log_with_the_loss_averaged_over_ranks(tmp_path):
    script = tmp_path / "train_two.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    launch(str(script), [str(out)], nproc=2, log_dir=str(tmp_path / "launch_logs"))
    everything = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert [p for p in everything if p.endswith("metrics.jsonl")] == [str(out / "metrics.jsonl")]
    assert len([p for p in everything if os.path.basename(p).startswith("vdlrecords")]) == 1
    assert len([p for p in everything if p.endswith(".png")]) == 1
    records = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == [2, 4, 6]
    rank0 = json.loads((tmp_path / "local-rank0.json").read_text())
    rank1 = json.loads((tmp_path / "local-rank1.json").read_text())
    for rec, (s0, l0, logged0, share0), (s1, l1, logged1, share1) in zip(records, rank0, rank1):
        assert rec["step"] == s0 == s1
        assert l0 != l1  # the ranks saw different batches
        assert rec["loss"] == logged0 == logged1
        assert rec["loss"] == pytest.approx((l0 + l1) / 2, rel=1e-6)
        assert rec["data_wait_share"] == share0 == share1 and 0 <= share0 <= 1  # pooled over ranks


def test_docstring_examples_run():
    for module in (callbacks.logger, callbacks.plots):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_every_scalar_reaches_visualdl_when_records_outnumber_its_queue(tmp_path, capfd):
    # 500 training records, 4 scalars each: many batches handed over, each longer than VisualDL's default queue
    # (10 records, a put that waits 5 s drops its record with a print)
    make_trainer(tmp_path, max_steps=500, logging_steps=1, evaluation_strategy="no", report_to=["visualdl"]).fit()
    assert [step for step, _ in vdl_points(tmp_path, "train/loss")] == list(range(1, 501))
    assert [step for step, _ in vdl_points(tmp_path, "train/learning_rate")] == list(range(1, 501))
    assert "not written" not in capfd.readouterr().out
