"""Pipeline parallel (issue 29, part B): paddle's PipelineLayer and 1F1B schedule inside the Trainer's loop.

Two real processes under paddle's launcher (gloo) run ``tests/distributed/workers/pipeline_ernie.py``: an ERNIE-style
classifier (4 blocks, random weights, dropout 0) cut into 2 stages (``models.ernie.pipeline.ErniePipe``), with the
test-only shim of paddle's GPU-only paths (``cpu_hybrid_shim.py``: ``ParallelEnv._device_id``, gloo's
send/recv on the calculation stream). The reference is one process training paddlenlp's single-card
``ErnieForSequenceClassification`` from the same weights on the whole global batch. dp x pp needs 4 processes:
not run here (gloo's group building on 4 CPU processes is what the sharding tests found unreliable); a GPU row.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from helpers import REPO, free_port, launch, silent_native_death
from patience import patience

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "pipeline_ernie.py")
STEPS = 6
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)


def _load(out, rank=0) -> dict:
    with open(os.path.join(out, f"result-rank{rank}.json")) as f:
        return json.load(f)


def _one_process(out, **opts) -> dict:
    os.makedirs(out, exist_ok=True)
    subprocess.run([sys.executable, WORKER, out, json.dumps({"pp": 1, "steps": STEPS, **opts})], check=True, env=ENV,
                   cwd=REPO, capture_output=True, timeout=patience(300))
    return _load(out)


def _two_stages(tmp_path, name, **opts):
    out = str(tmp_path / name)
    os.makedirs(out, exist_ok=True)
    launch(WORKER, [out, json.dumps({"pp": 2, "steps": STEPS, "shim": True, **opts})], nproc=2,
           log_dir=str(tmp_path / f"logs-{name}"), timeout=patience(400))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, the single-card model, the whole global batch per step (no accumulation)."""
    return _one_process(str(tmp_path_factory.mktemp("one")), predict=True)


def _max_diff(a, b) -> float:
    return float(np.abs(np.array(a, dtype=np.float64) - np.array(b, dtype=np.float64)).max())


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_two_stages_train_like_one_process(reference, tmp_path, micro_batches):
    out = _two_stages(tmp_path, "pp2", accumulation=micro_batches, predict=True, export=micro_batches == 2,
                      train_api=micro_batches == 4)
    r0, r1 = _load(out, 0), _load(out, 1)
    assert r0["layout"]["pp_degree"] == 2 and r0["layout"]["dp_degree"] == 1 and r0["model"] == "PipelineParallel"
    assert r0["global_step"] == reference["global_step"] == STEPS
    assert r0["losses"] == r1["losses"]  # the last stage's loss, broadcast to the first at logging steps
    # what callbacks see as the step's loss: None on the first stage (it has none), the loss itself on the last
    assert r0["step_losses"] == [None] * STEPS, r0["step_losses"]
    assert len(r1["step_losses"]) == STEPS and _max_diff(r1["step_losses"], r1["losses"]) <= 1e-6  # logging_steps 1
    diff = _max_diff(r0["losses"], reference["losses"])
    print(f"PARITY pp2 x {micro_batches} micro-batches: max loss difference {diff:.3g} over {STEPS} steps")
    assert diff <= 1e-6, (r0["losses"], reference["losses"])
    assert abs(r0["eval_loss"] - reference["eval_loss"]) <= 1e-6 and r0["eval_loss"] == r1["eval_loss"]
    assert r0["eval_samples"] == reference["eval_samples"] == 20  # each sample once, not once per stage
    assert _max_diff(r0["predictions"], reference["predictions"]) <= 1e-5 and r0["predictions"] == r1["predictions"]
    if micro_batches == 2:
        _check_export(r0["export"], reference["predictions"])
    else:  # PaddleNLP's train(): training_loss is the mean step loss on every stage (the first holds none itself)
        mean = float(np.mean(reference["losses"]))
        assert abs(r0["training_loss"] - mean) <= 1e-6 and r0["training_loss"] == r1["training_loss"], \
            (r0["training_loss"], r1["training_loss"], mean)


def test_the_nan_guard_agrees_over_stages_that_hold_no_loss(reference, tmp_path):
    """NaNGuard(action="skip") sums every rank's non-finite flag at each step: the first stage, whose step loss is
    None, joins with a clear flag (it used to return early and leave the last stage waiting in the all-reduce)."""
    out = _two_stages(tmp_path, "guard", accumulation=2, nan_guard=True)
    r0, r1 = _load(out, 0), _load(out, 1)
    assert r0["global_step"] == STEPS and r0["losses"] == r1["losses"]
    assert _max_diff(r0["losses"], reference["losses"]) <= 1e-6  # nothing skipped: the losses are finite


def _check_export(path, expected):
    """The export is the single-card model with every stage's weights: paddle.inference gives the reference's
    predictions on the same inputs."""
    from trainer.deploy.predictor import create_predictor, run_predictor

    spec = importlib.util.spec_from_file_location("pipeline_ernie", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    from models.ernie.batching import collate

    batch = collate([worker.dataset(12, 11)[i] for i in range(12)], as_tensors=False, length=worker.MAX_LEN + 1)
    with open(os.path.join(path, "export.json")) as f:
        names = [i["name"] for i in json.load(f)["inputs"]]
    (logits,) = run_predictor(create_predictor(path), [batch[n] for n in names], names)
    assert _max_diff(logits, expected) <= 1e-5


def test_resume_pp2_then_pp1_then_pp2_equals_the_uninterrupted_run(reference, tmp_path):
    """Each stage writes its tensors under the single-card model's names: a pp 2 checkpoint resumes on one process
    (the single-card model), whose checkpoint resumes on two stages, and the losses are the uninterrupted run's."""
    out = str(tmp_path / "run")
    opts = {"accumulation": 2, "save_steps": 100}  # saves where stop_at stops, and at the end
    launch(WORKER, [out, json.dumps({"pp": 2, "steps": STEPS, "shim": True, "stop_at": 2, **opts})], nproc=2,
           log_dir=str(tmp_path / "logs-a"), timeout=patience(400))
    one = _one_process(out, stop_at=4, resume="auto", **opts)
    assert one["global_step"] == 4
    with open(os.path.join(out, "checkpoints", "step-2", "manifest.json")) as f:
        manifest = json.load(f)
    writers = {k: v["parts"][0]["rank"] for k, v in manifest["tensors"].items()}
    assert writers["model/ernie.embeddings.word_embeddings.weight"] == 0 and writers["model/classifier.weight"] == 1
    launch(WORKER, [out, json.dumps({"pp": 2, "steps": STEPS, "shim": True, "resume": "auto", **opts})], nproc=2,
           log_dir=str(tmp_path / "logs-c"), timeout=patience(400))
    final = _load(out)
    diff = _max_diff(final["losses"], reference["losses"])
    print(f"RESUME pp2 -> pp1 -> pp2: max loss difference {diff:.3g} over {STEPS} steps")
    assert final["global_step"] == STEPS and diff <= 1e-6, (final["losses"], reference["losses"])
    assert abs(final["eval_loss"] - reference["eval_loss"]) <= 1e-6


def test_the_ernie_task_builds_stages_and_its_export_predicts(tmp_path):
    """``ptrain run ernie --pipeline_parallel_degree 2``'s build: ErniePipe stages (fixed-length batches, the
    classification loss), evaluation through the stages, and the task's export (every stage's weights in the
    single-card model) answering ``ptrain predict``'s call."""
    out = _two_stages(tmp_path, "task", task=True, accumulation=2, steps=3)
    r0, r1 = _load(out, 0), _load(out, 1)
    assert r0["model"] == "PipelineParallel" and r0["global_step"] == 3
    assert r0["eval_loss"] == r1["eval_loss"] and r0["eval_accuracy"] == r1["eval_accuracy"]
    assert [p["label"] for p in r0["predicted"]] and all(0 < p["score"] <= 1 for p in r0["predicted"])
    assert os.path.isfile(os.path.join(out, "inference", "task.json"))


def test_a_users_own_pipeline_layer_trains_and_resumes_on_its_own_names(tmp_path):
    """A PipelineLayer passed in as it is (no single_card_names): its checkpoints keep paddle's names by layer index,
    and a run stopped at step 3 and resumed ends as the uninterrupted one."""
    whole = _two_stages(tmp_path, "whole", toy=True, accumulation=2)
    out = str(tmp_path / "parts")
    for opts in ({"stop_at": 3}, {"resume": "auto"}):
        launch(WORKER, [out, json.dumps({"pp": 2, "steps": STEPS, "shim": True, "toy": True, "accumulation": 2,
                                         "save_steps": 100, **opts})], nproc=2,
               log_dir=str(tmp_path / f"logs-{len(opts)}{list(opts)[0]}"), timeout=patience(400))
    with open(os.path.join(out, "checkpoints", "step-3", "manifest.json")) as f:
        names = sorted(k for k in json.load(f)["tensors"] if k.startswith("model/"))
    assert names[0].startswith("model/0.") and names[-1].startswith("model/5.")
    a, b = _load(whole), _load(out)
    assert a["global_step"] == b["global_step"] == STEPS and _max_diff(a["losses"], b["losses"]) <= 1e-6


def _ptrain_launch(out, log_dir, max_restarts, **opts):
    cmd = [sys.executable, "-m", "trainer.cli", "launch", "--nproc", "2", "--max_restarts", str(max_restarts),
           "--master", f"127.0.0.1:{free_port()}", "--log_dir", log_dir, WORKER, out,
           json.dumps({"pp": 2, "steps": STEPS, "shim": True, "accumulation": 2, **opts}, separators=(",", ":"))]
    env = dict(os.environ, PYTHONPATH=REPO)  # (paddle's launcher refuses an empty CUDA_VISIBLE_DEVICES)
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _left_behind(out) -> list:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if out in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("how, code", [("kill", 1), ("raise", 4)])
def test_a_crashed_stage_ends_the_job_at_once_with_a_restartable_code(tmp_path, how, code):
    """Stage 1 dies (SIGKILL) or raises (a callback's error, exit 4) in step 3 while stage 0 waits for it in the
    schedule: the job ends within paddle's launcher's bound (its 2 s watch, then SIGTERM and SIGKILL after 3 s),
    not gloo's 30-minute timeout, with a code --max_restarts restarts, and no process is left."""
    for attempt in range(3):  # launched again only when a rank died of paddle's silent native death first
        out, logs = str(tmp_path / f"run-{attempt}"), str(tmp_path / f"logs-{attempt}")
        os.makedirs(out)
        proc = _ptrain_launch(out, logs, 0, crash_at_step=3, crash_how=how)
        text, _ = proc.communicate(timeout=patience(400))
        ended = time.time()
        marker = os.path.join(out, "crashed-at")
        if os.path.exists(marker) or \
                not silent_native_death(subprocess.CompletedProcess(proc.args, proc.returncode, text, ""), logs):
            break
    assert os.path.exists(marker), f"the job ended (exit {proc.returncode}) before stage 1 reached step 3:\n{text[-3000:]}"
    with open(marker) as f:
        took = ended - float(f.read())
    print(f"FAILURE pp2, stage 1 {how}: job ended {took:.1f} s after the crash, exit {proc.returncode}")
    assert proc.returncode == code, text[-3000:]
    assert took <= patience(60), text[-3000:]
    assert "exit code 143" not in text  # never reported as a preemption, which no restart would follow
    assert _left_behind(out) == []


def test_a_killed_stage_is_restarted_and_the_run_finishes_as_uninterrupted(reference, tmp_path):
    """--max_restarts 1: the job starts again from the latest checkpoint (step 2) and ends like the run that never
    failed, as a data-parallel job does."""
    out = str(tmp_path / "run")
    os.makedirs(out)
    proc = _ptrain_launch(out, str(tmp_path / "logs"), 1, crash_at_step=3, crash_how="kill", save_steps=2)
    text, _ = proc.communicate(timeout=patience(600))
    assert proc.returncode == 0, text[-3000:]
    assert "restart 1 of 1" in text
    final = _load(out)
    assert final["global_step"] == STEPS and _max_diff(final["losses"], reference["losses"]) <= 1e-6
    assert _left_behind(out) == []


# ---- in-process: the pieces without a launch --------------------------------------------------------------------
def test_split_batch_and_one_shape_per_step():
    import paddle

    from trainer.errors import DataError
    from trainer.parallel.pipeline import _check_one_shape, split_batch

    a = {"input_ids": paddle.zeros([2, 5], "int64"), "labels": paddle.zeros([2], "int64")}
    b = {"input_ids": paddle.zeros([2, 7], "int64"), "labels": paddle.zeros([2], "int64")}
    inputs, labels = split_batch(a, None)
    assert list(inputs) == ["input_ids"] and labels is a["labels"]
    _check_one_shape([split_batch(a, None), split_batch(a, None)])
    with pytest.raises(DataError, match="micro-batch 1 of the step has shapes"):
        _check_one_shape([split_batch(a, None), split_batch(b, None)])


def test_stage_names_map_optimizer_tensors_to_the_stage():
    from trainer.layout.stages import held_optimizer_tensors

    tensors = {"param:ernie.pooler.dense.weight_moment1_0": 1, "param:classifier.weight_moment1_0": 2,
               "master:classifier.weight": 3, "LR": 4}
    assert held_optimizer_tensors(tensors, {"classifier.weight"}) == {
        "param:classifier.weight_moment1_0": 2, "master:classifier.weight": 3, "LR": 4}


def test_a_rank_stopped_by_the_launcher_after_another_failed_is_a_restartable_failure():
    import subprocess as sp

    from trainer.launch.restarts import _failure_of
    from trainer.launch.supervise import STOPPED_AFTER_FAILURE, _Supervisor

    sup = _Supervisor(sp.Popen([sys.executable, "-c", "pass"]))
    sup.proc.wait()
    assert sup.exit_code(256 - signal.SIGTERM) == STOPPED_AFTER_FAILURE == 1  # paddle's 241: a rank died of SIGTERM
    assert sup.exit_code(256 - signal.SIGKILL) == 137
    sup.signum = signal.SIGTERM  # ptrain itself was told to stop: a preemption, whatever the launcher says
    assert sup.exit_code(256 - signal.SIGTERM) == 143
    record = {"rank": 1, "code": 4, "error": "CallbackError: ..."}
    assert _failure_of(STOPPED_AFTER_FAILURE, [record])[0] == 4
    assert _failure_of(137, [record])[0] == 137


def test_auto_find_batch_size_is_refused_under_pipeline_parallel_in_one_line():
    from trainer.auto_batch import AutoBatch
    from trainer.errors import ConfigError
    from trainer.layout import Layout

    with pytest.raises(ConfigError, match="auto_find_batch_size.*pipeline_parallel_degree=2") as info:
        AutoBatch(2, 8, Layout.plan(world_size=2, pipeline_parallel_degree=2))
    assert "\n" not in str(info.value)

