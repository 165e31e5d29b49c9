"""A PaddleNLP Trainer script runs on this project with one changed line.

tests/compat/scripts/text_classification.py (PdArgumentParser,
DataCollatorWithPadding, EarlyStoppingCallback, do_train/do_eval/do_predict/
do_export, train/save_model/log_metrics/save_metrics/save_state) runs once
as written, on PaddleNLP's Trainer, and once with ``from paddlenlp.trainer
import Trainer`` replaced by ``from trainer import Trainer``. Both finish,
their dev and test accuracies agree, the recording TrainerCallback sees the
same hook calls in the same order, and the files a PaddleNLP user relies on
are written (save_model's directory loads with from_pretrained).
"""

import contextlib
import difflib
import importlib.util
import io
import json
import os
import re
import sys

import pytest

# found, not imported: collecting the suite must not import paddlenlp in every worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import (  # noqa: E402
    OUR_IMPORT,
    PADDLENLP_IMPORT,
    SCRIPT,
    make_tiny_ernie,
    run_script,
    script_source,
    write_data,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("swap")
    ernie, data = make_tiny_ernie(str(tmp / "ernie")), write_data(str(tmp / "data"))
    common = ["--model_name_or_path", ernie, "--data_dir", data, "--do_train", "--do_eval", "--do_predict",
              "--do_export", "--num_train_epochs", "3", "--learning_rate", "2e-3", "--per_device_train_batch_size", "16",
              "--per_device_eval_batch_size", "32", "--evaluation_strategy", "epoch", "--save_strategy", "epoch",
              "--load_best_model_at_end", "--metric_for_best_model", "accuracy", "--logging_steps", "5",
              "--report_to", "none", "--disable_tqdm", "true", "--save_total_limit", "2", "--device", "cpu"]
    out = {}
    for name, ours, our_arguments in (("paddlenlp", False, False), ("ours", True, False), ("ours+args", True, True)):
        argv = common + ["--output_dir", str(tmp / name), "--early_stopping_patience", "3"]
        console = io.StringIO()
        with contextlib.redirect_stdout(console):  # what the user's terminal shows (both trainers print to stdout)
            out[name] = run_script(script_source(ours, our_arguments), argv, str(tmp), name.replace("+", "_"))
        out[name]["console"] = console.getvalue()
        sys.stdout.write(out[name]["console"])
        out[name]["dir"] = str(tmp / name)
    return out


def test_only_the_import_line_differs():
    theirs, ours = script_source(ours=False), script_source(ours=True)
    diff = [line for line in difflib.unified_diff(theirs.splitlines(True), ours.splitlines(True), n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == ["-" + PADDLENLP_IMPORT, "+" + OUR_IMPORT]
    assert os.path.isfile(SCRIPT)


def test_both_trainers_finish_with_the_same_accuracy(runs):
    theirs, ours = runs["paddlenlp"], runs["ours"]
    print({k: {m: v.get(m) for m in ("eval_accuracy", "test_accuracy", "train_loss", "global_step")} for k, v in runs.items()})
    assert theirs["global_step"] == ours["global_step"]
    assert ours["eval_accuracy"] >= 0.9 and theirs["eval_accuracy"] >= 0.9  # the task is learnt by both
    assert abs(ours["eval_accuracy"] - theirs["eval_accuracy"]) <= 0.1
    assert abs(ours["test_accuracy"] - theirs["test_accuracy"]) <= 0.15
    # PaddleNLP's arguments bring PaddleNLP's numbers (trainer.compat.paddlenlp_recipe): the same training loss
    assert abs(ours["train_loss"] - theirs["train_loss"]) <= 1e-6, (ours["train_loss"], theirs["train_loss"])


def test_the_console_shows_each_training_log_with_report_to_none(runs):
    """PaddleNLP's report_to names its integrations only: with none (and disable_tqdm) its console still shows each
    training log record (its logger's lines on stderr); so does ours, one line per record (before: nothing)."""
    with open(os.path.join(runs["paddlenlp"]["dir"], "trainer_state.json"), encoding="utf-8") as f:
        theirs = [r for r in json.load(f)["log_history"] if "loss" in r]
    ours = [line for line in runs["ours"]["console"].splitlines() if re.search(r"(^| )loss=", line)]
    assert theirs and len(ours) == len(theirs), (theirs, ours)


def test_swapping_training_arguments_too(runs):
    """Our TrainingArguments (two changed import lines) parse the same flags and train to the same accuracy."""
    theirs, ours = runs["paddlenlp"], runs["ours+args"]
    assert ours["global_step"] == theirs["global_step"] and ours["eval_accuracy"] >= 0.9
    assert abs(ours["eval_accuracy"] - theirs["eval_accuracy"]) <= 0.1


def test_the_recording_callback_sees_the_same_hook_calls(runs):
    theirs, ours = runs["paddlenlp"]["events"], runs["ours"]["events"]
    assert "on_evaluate" in ours and "on_save" in ours and "on_train_end" in ours
    assert ours == theirs, "\n".join(difflib.unified_diff(theirs, ours, "paddlenlp", "ours", lineterm="", n=2))


def test_the_files_a_paddlenlp_user_expects(runs):
    from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = runs["ours"]["dir"]
    for name in ("train_results.json", "eval_results.json", "all_results.json", "trainer_state.json",
                 "export/model.pdmodel" if os.path.exists(os.path.join(out, "export/model.pdmodel")) else "export/model.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    with open(os.path.join(out, "all_results.json")) as f:
        results = json.load(f)
    assert {"train_loss", "train_runtime", "eval_accuracy"} <= set(results)
    model = AutoModelForSequenceClassification.from_pretrained(out)  # save_model wrote the save_pretrained format
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.classifier.weight.shape[1] == 2 and tokenizer.vocab_size > 10
