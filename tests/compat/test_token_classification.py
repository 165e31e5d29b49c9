"""Token classification moves with one import: tests/compat/scripts/token_classification.py
(AutoModelForTokenClassification, DataCollatorForTokenClassification, seqeval) under
PaddleNLP's Trainer and ours, on one process and on two (paddle.distributed.launch, gloo).

The collator pads each batch to its own longest sentence, so logits are [4, 9, 5] in one batch
and [4, 22, 5] in the next: the evaluation joins them padded with -100 (trainer.evaluation.join_batches)
and the gather across ranks pads the same way. Training under both trainers is compared by its
metrics; evaluation and prediction of one trained model are compared exactly: predictions,
label_ids (with their -100 padding) and the seqeval metrics equal, whichever trainer and however
many processes.
"""

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

# found, not imported: collecting the suite must not import paddlenlp in every worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None or importlib.util.find_spec("seqeval") is None,
                                reason="paddlenlp and seqeval not installed")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import (OUR_IMPORT, PADDLENLP_IMPORT, make_tiny_ernie, only_the_import_differs,  # noqa: E402
                            run_script, script_source, write_tagging_data)
from helpers import launch  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "token_classification.py")
SEQEVAL = ("precision", "recall", "f1", "accuracy", "tagged_tokens")


def _load(out):
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with np.load(os.path.join(out, "predictions.npz")) as z:
        return summary, z["predictions"], z["label_ids"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokcls")
    ernie, data = make_tiny_ernie(str(tmp / "ernie")), write_tagging_data(str(tmp / "data"))
    common = ["--data_dir", data, "--report_to", "none", "--disable_tqdm", "true", "--device", "cpu", "--seed", "42"]
    train = ["--model_name_or_path", ernie, "--do_train", "--do_eval", "--num_train_epochs", "2",
             "--learning_rate", "5e-3", "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "8",
             "--evaluation_strategy", "epoch", "--save_strategy", "no", "--logging_steps", "5"]
    out = {}
    for name, ours in (("paddlenlp", False), ("ours", True)):
        argv = common + train + ["--output_dir", str(tmp / f"train-{name}")]
        out[f"train-{name}"] = run_script(script_source(ours, script=SCRIPT), argv, str(tmp), f"train_{name}")
    trained = str(tmp / "train-paddlenlp")  # save_model's directory: one model for every evaluation below
    evaluate = common + ["--model_name_or_path", trained, "--do_eval", "--do_predict", "--per_device_eval_batch_size", "4"]
    for name, ours in (("paddlenlp", False), ("ours", True)):
        source = script_source(ours, script=SCRIPT)
        run_script(source, evaluate + ["--output_dir", str(tmp / f"eval1-{name}")], str(tmp), f"eval1_{name}")
        out[f"eval1-{name}"] = _load(str(tmp / f"eval1-{name}"))
        path = tmp / f"launch_{name}.py"
        path.write_text(source, encoding="utf-8")
        launch(str(path), evaluate + ["--output_dir", str(tmp / f"eval2-{name}")], nproc=2, log_dir=str(tmp / f"logs-{name}"))
        out[f"eval2-{name}"] = _load(str(tmp / f"eval2-{name}"))
    return out


def test_only_the_import_line_differs():
    assert only_the_import_differs(SCRIPT) == ["-" + PADDLENLP_IMPORT, "+" + OUR_IMPORT]


def test_training_under_both_trainers_reaches_the_same_scores(runs):
    theirs, ours = runs["train-paddlenlp"], runs["train-ours"]
    print({k: runs[k]["eval"] for k in ("train-paddlenlp", "train-ours")})
    assert theirs["global_step"] == ours["global_step"]
    for metric in ("eval_f1", "eval_accuracy"):
        assert abs(theirs["eval"][metric] - ours["eval"][metric]) <= 0.05, metric
    assert abs(theirs["train_loss"] - ours["train_loss"]) <= 0.05
    assert set(theirs["train_metrics"]) <= set(ours["train_metrics"])  # train_runtime, ..._per_second, progress_or_epoch


def test_metric_keys_and_types_match_paddlenlp(runs):
    theirs, ours = runs["train-paddlenlp"], runs["train-ours"]
    assert set(theirs["eval_keys"]) - {"progress_or_epoch"} <= set(ours["eval_keys"])
    assert {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"} <= set(ours["eval_keys"])
    assert ours["eval_types"]["eval_tagged_tokens"] == theirs["eval_types"]["eval_tagged_tokens"] == "int"


@pytest.mark.parametrize("world", ["eval1", "eval2"])
def test_predictions_labels_and_seqeval_equal_paddlenlps(runs, world):
    (s_theirs, p_theirs, l_theirs), (s_ours, p_ours, l_ours) = runs[f"{world}-paddlenlp"], runs[f"{world}-ours"]
    assert s_ours["world_size"] == s_theirs["world_size"] == (1 if world == "eval1" else 2)
    assert p_ours.shape == p_theirs.shape and p_ours.shape[0] == 37 and p_ours.shape[2] == 5
    np.testing.assert_array_equal(l_ours, l_theirs)  # -100 where a sentence is shorter than the longest
    assert (l_ours == -100).any() and (p_ours == -100).any()
    # at every tagged token the logits agree. Where the label is -100 a prediction is either the -100 of the
    # join or the model's output for a [PAD] of its batch; which one depends on the batch a sentence fell in,
    # and on two processes PaddleNLP deals batches to ranks in turn while this trainer gives each rank a
    # contiguous shard (1 process: the same batches, so equal everywhere)
    tagged = l_ours != -100
    np.testing.assert_allclose(p_ours[tagged], p_theirs[tagged], rtol=1e-5, atol=1e-5)
    if world == "eval1":
        np.testing.assert_allclose(p_ours, p_theirs, rtol=1e-5, atol=1e-5)
    for split in ("eval", "test"):
        for m in SEQEVAL:
            assert s_ours[split][f"{split}_{m}"] == pytest.approx(s_theirs[split][f"{split}_{m}"], abs=1e-9), (split, m)


def test_two_processes_give_what_one_gives(runs):
    (s1, p1, l1), (s2, p2, l2) = runs["eval1-ours"], runs["eval2-ours"]
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_allclose(p1[l1 != -100], p2[l1 != -100], rtol=1e-5, atol=1e-5)
    # (the loss is not compared: each batch's loss is a mean over its tokens, weighted by its sentences, so it
    # follows how sentences are batched, under PaddleNLP's Trainer as under ours)
    for m in SEQEVAL:
        assert s1["eval"][f"eval_{m}"] == pytest.approx(s2["eval"][f"eval_{m}"], abs=1e-9), m
