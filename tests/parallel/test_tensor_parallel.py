"""Tensor parallel through fleet (issue 29): an ERNIE-style encoder built with fleet's ColumnParallelLinear /
RowParallelLinear / VocabParallelEmbedding trains under TensorParallel + HybridParallelOptimizer on 2 gloo
processes like one process does (same whole weights, same global batch), writes sharded checkpoints that
resume onto the other layout (mp 2 -> 1, 1 -> 2), keeps the model-parallel RNG tracker's states for an exact
resume with dropout, and exports one single-card inference model.

The workers (tests/distributed/workers/tp_ernie.py) install the test-only shim tests/parallel/cpu_hybrid_shim.py
(paddle's GPU-only communication paths of tensor parallel on a CPU build). 4 processes (dp 2 x mp 2) are a GPU
row (benchmarks/gpu_check.py); the data-parallel side of the layout (which slice a rank reads) is checked in
test_layout.py, and each run here checks that both tensor-parallel ranks read, and log, the same.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, launch
from patience import patience

WORKER = os.path.join(REPO, "tests", "distributed", "workers", "tp_ernie.py")
STEPS, SAVE_AT = 6, 3


def one_process(out, **opts):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, WORKER, out, json.dumps(opts)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result(out, 0)


def two_processes(out, logs, **opts):
    os.makedirs(out, exist_ok=True)
    launch(WORKER, [out, json.dumps(opts)], nproc=2, log_dir=logs, timeout=patience(400))
    r0, r1 = result(out, 0), result(out, 1)
    assert r0["losses"] == r1["losses"] and r0["eval_loss"] == r1["eval_loss"]  # one batch per tp group, one mean
    return r0


def result(out, rank):
    with open(os.path.join(out, f"result-rank{rank}.json")) as f:
        return json.load(f)


def max_diff(a, b, steps=None):
    keys = steps or sorted(set(a) & set(b), key=int)
    return max(abs(a[k] - b[k]) for k in keys)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted runs, each saving at step 3 and exporting at the end: one process and mp 2."""
    base = tmp_path_factory.mktemp("tp")
    one = one_process(str(base / "one"), mp=1, steps=STEPS, save_steps=SAVE_AT, export=True)
    two = two_processes(str(base / "mp2"), str(base / "logs-mp2"), mp=2, steps=STEPS, save_steps=SAVE_AT, export=True)
    return base, one, two


def test_mp2_losses_match_one_process(runs):
    base, one, two = runs
    assert two["layout"]["mp_degree"] == 2 and two["layout"]["dp_degree"] == 1
    assert (two["model"], two["optimizer"]) == ("TensorParallel", "HybridParallelOptimizer")
    assert len(one["losses"]) == len(two["losses"]) == STEPS
    diff = max_diff(one["losses"], two["losses"])
    print(f"PARITY mp2: max loss difference {diff:.3g} over {STEPS} steps")
    assert diff <= 1e-6, (one["losses"], two["losses"])
    assert abs(one["eval_loss"] - two["eval_loss"]) <= 1e-6


def test_mp2_checkpoint_is_sharded_in_blocks(runs):
    base, _, _ = runs
    with open(base / "mp2" / "checkpoints" / f"step-{SAVE_AT}" / "manifest.json") as f:
        manifest = json.load(f)
    assert manifest["format_version"] == 2 and manifest["layout"]["mp_degree"] == 2
    tensors = manifest["tensors"]
    column = tensors["model/layers.0.attention.qkv.weight"]  # ColumnParallelLinear: split on axis 1
    assert column["shape"] == [32, 96] and [p["offsets"] for p in column["parts"]] == [[0, 0], [0, 48]]
    row = tensors["model/layers.0.ffn_out.weight"]  # RowParallelLinear: axis 0
    assert row["shape"] == [64, 32] and [p["offsets"] for p in row["parts"]] == [[0, 0], [32, 0]]
    vocab = tensors["model/word_embeddings.weight"]  # VocabParallelEmbedding: axis 0
    assert [p["offsets"] for p in vocab["parts"]] == [[0, 0], [32, 0]]
    moment = tensors["optimizer/param:layers.0.ffn_out.weight_moment1_0"]  # the moments follow their parameter
    assert [p["offsets"] for p in moment["parts"]] == [[0, 0], [32, 0]]
    assert [p["rank"] for p in tensors["model/pooler.weight"]["parts"]] in ([0], [1])  # whole: written once
    with open(base / "mp2" / "checkpoints" / f"step-{SAVE_AT}" / "trainer.json") as f:
        rng = json.load(f)["rng_per_rank"]
    trackers = [r["mp_tracker"]["model_parallel_rng"] for r in rng]
    assert trackers[0] != trackers[1]  # each tensor-parallel rank its own dropout stream


def test_resume_mp2_to_mp1_and_mp1_to_mp2(runs, tmp_path):
    base, one, _ = runs
    later = [str(s) for s in range(SAVE_AT + 1, STEPS + 1)]
    to_one = one_process(str(tmp_path / "to-one"), mp=1, steps=STEPS,
                         resume=str(base / "mp2" / "checkpoints" / f"step-{SAVE_AT}"))
    to_two = two_processes(str(tmp_path / "to-two"), str(tmp_path / "logs"), mp=2, steps=STEPS,
                           resume=str(base / "one" / "checkpoints" / f"step-{SAVE_AT}"))
    for name, resumed in (("mp2 -> mp1", to_one), ("mp1 -> mp2", to_two)):
        assert resumed["global_step"] == STEPS
        diff = max_diff(one["losses"], resumed["losses"], later)
        print(f"RESUME {name}: max loss difference {diff:.3g} over steps {later[0]}-{later[-1]}")
        assert diff <= 1e-6, (name, one["losses"], resumed["losses"])


def test_export_of_mp2_run_predicts_as_the_single_card_model(runs):
    from trainer.deploy.predictor import create_predictor, run_predictor

    base, _, _ = runs
    with open(base / "mp2" / "inference" / "export.json") as f:
        report = json.load(f)
    assert [i["name"] for i in report["inputs"]] == ["input_ids", "token_type_ids"]
    rng = np.random.RandomState(3)
    ids = rng.randint(1, 64, size=(5, 12)).astype("int64")
    ids[:, 9:] = 0
    outputs = [run_predictor(create_predictor(str(base / run / "inference")), [ids, np.zeros_like(ids)])[0]
               for run in ("one", "mp2")]
    assert outputs[0].shape == (5, 3)
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5)
    # the other way to a single-card model: the final checkpoint's shards put together on one process
    import paddle

    from models.ernie.parallel_model import ErnieTPConfig, ErnieTPForSequenceClassification
    from trainer.checkpoint.load import load_weights

    sys.path.insert(0, os.path.dirname(WORKER))
    from tp_ernie import SHAPE

    single = ErnieTPForSequenceClassification(ErnieTPConfig(**SHAPE, hidden_dropout_prob=0.0,
                                                            attention_probs_dropout_prob=0.0))
    load_weights(single, str(base / "mp2" / "checkpoints" / f"step-{STEPS}"))
    single.eval()
    np.testing.assert_allclose(single(paddle.to_tensor(ids)).numpy(), outputs[1], atol=1e-5)


def test_dropout_follows_the_rng_tracker_and_resumes_exactly(tmp_path):
    """With dropout, mp 2 resumed from its step-3 checkpoint logs what the uninterrupted mp 2 run logged: the
    attention dropout draws from fleet's model-parallel tracker, whose states the checkpoint restores."""
    whole = two_processes(str(tmp_path / "whole"), str(tmp_path / "logs1"), mp=2, steps=STEPS, save_steps=SAVE_AT,
                          dropout=0.2)
    resumed = two_processes(str(tmp_path / "resumed"), str(tmp_path / "logs2"), mp=2, steps=STEPS, dropout=0.2,
                            resume=str(tmp_path / "whole" / "checkpoints" / f"step-{SAVE_AT}"))
    later = [str(s) for s in range(SAVE_AT + 1, STEPS + 1)]
    assert max_diff(whole["losses"], resumed["losses"], later) <= 1e-6, (whole["losses"], resumed["losses"])
    no_dropout = two_processes(str(tmp_path / "plain"), str(tmp_path / "logs3"), mp=2, steps=2)
    assert whole["losses"]["1"] != no_dropout["losses"]["1"]  # dropout acted


def test_clipping_is_by_the_global_norm_over_the_group(tmp_path):
    """SGD with a clip far below the gradient norm: the update is the clip's coefficient times the gradient, so a norm
    taken over one rank's slices only (not over the tensor-parallel group) would move the losses by far more than
    1e-6 (unclipped, the same run's losses differ by up to 2)."""
    opts = dict(steps=STEPS, clip=0.05, optim="sgd", lr=0.5)
    one = one_process(str(tmp_path / "one"), mp=1, **opts)
    two = two_processes(str(tmp_path / "two"), str(tmp_path / "logs"), mp=2, **opts)
    diff = max_diff(one["losses"], two["losses"])
    print(f"PARITY mp2 sgd clip 0.05: max loss difference {diff:.3g}")
    assert diff <= 1e-6, (one["losses"], two["losses"])


def test_a_nan_in_one_ranks_slice_is_skipped_on_every_rank(tmp_path):
    """NaNGuard() under tensor parallel: a non-finite gradient in the block of one rank skips the step on both ranks
    (the check is reduced over the ranks), and the run goes on as one process that skipped the same step."""
    opts = dict(steps=STEPS, nan_grad_at_step=3)
    one = one_process(str(tmp_path / "one"), mp=1, **opts)
    two = two_processes(str(tmp_path / "two"), str(tmp_path / "logs"), mp=2, **opts)
    assert one["skipped_steps"] == two["skipped_steps"] == result(str(tmp_path / "two"), 1)["skipped_steps"] == 1
    assert max_diff(one["losses"], two["losses"]) <= 1e-6, (one["losses"], two["losses"])


PLAIN_MODEL = """
import os, sys
sys.path.append(os.path.join({repo!r}, "tests"))
import parallel.cpu_hybrid_shim as shim  # test-only: paddle's GPU-only paths of tensor parallel on CPU
shim.install()
import paddle
from helpers import ToyDataset, make_mlp
from trainer import Trainer, TrainingArguments
args = TrainingArguments(output_dir=sys.argv[1], tensor_parallel_degree=2, max_steps=2, report_to=[],
                         evaluation_strategy="no", save_strategy="no", per_device_train_batch_size=8)
Trainer(make_mlp(), args, train_dataset=ToyDataset(32), loss_fn=paddle.nn.CrossEntropyLoss()).fit()
"""


def test_a_model_without_parallel_layers_trains_with_one_warning_line(tmp_path):
    """tensor_parallel_degree=2 on a plain MLP (no fleet parallel layers): it trains unsplit, and rank 0 says so in
    one warning line (issue 40's note: it used to say nothing)."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_MODEL.format(repo=REPO))
    logs = str(tmp_path / "logs")
    launch(str(script), [tmp_path / "out"], nproc=2, log_dir=logs, timeout=patience(300))
    said = [open(os.path.join(logs, f"workerlog.{rank}")).read().count("Sequential has no tensor-parallel layers")
            for rank in (0, 1)]
    assert said == [1, 0]
