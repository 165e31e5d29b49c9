"""PaddleNLP's numbers to the last digit: tests/compat/scripts/glue_parity.py (a GLUE-style
fine-tuning script: set_seed, ERNIE with its dropout, warmup, weight decay, PaddleNLP's default
clipping) runs under PaddleNLP 2.8's Trainer and, with only its ``Trainer`` import changed, under
ours, on one process and on two (paddle.distributed.launch, gloo). Every record of
``trainer_state.json``'s log history has the same keys, and every value that is not a clock reading
(loss, learning_rate, eval_loss, eval_accuracy, train_loss, steps, epochs) agrees within 1e-6; so do
``evaluate()``'s metrics and ``train()``'s.

The differences this closes (trainer.compat.paddlenlp_recipe): the training order (one process:
numpy's global state seeded with ``seed``; two: ``RandomState(epoch)``), the warmup ramp and its
length, the weight-decay rule, the clipping arithmetic, the log record's keys and rounding, and
``train_loss`` as the mean over ranks.
"""

import importlib.util
import json
import os
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import (
    OUR_IMPORT,
    PADDLENLP_IMPORT,
    make_tiny_ernie,
    only_the_import_differs,
    run_script,
    script_source,
    write_data,
)
from helpers import launch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "glue_parity.py")
TOLERANCE = 1e-6


def _clock(key: str) -> bool:
    return "runtime" in key or "per_second" in key


def _read(out: str) -> dict:
    with open(os.path.join(out, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return {"history": history, **json.load(f)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numbers")
    ernie, data = make_tiny_ernie(str(tmp / "ernie")), write_data(str(tmp / "data"), n_train=200, n_dev=64)
    argv = ["--model_name_or_path", ernie, "--data_dir", data, "--num_train_epochs", "2", "--learning_rate", "2e-3",
            "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "24",
            "--evaluation_strategy", "epoch", "--logging_steps", "2", "--warmup_ratio", "0.15",
            "--weight_decay", "0.01", "--report_to", "none", "--disable_tqdm", "true", "--device", "cpu",
            "--seed", "7"]
    out = {}
    for name, ours in (("paddlenlp", False), ("ours", True)):
        source = script_source(ours, script=SCRIPT)
        run_script(source, argv + ["--output_dir", str(tmp / f"one-{name}")], str(tmp), f"one_{name}")
        out[("one", name)] = _read(str(tmp / f"one-{name}"))
        path = tmp / f"two_{name}.py"
        path.write_text(source, encoding="utf-8")
        launch(str(path), argv + ["--output_dir", str(tmp / f"two-{name}")], nproc=2, log_dir=str(tmp / f"logs-{name}"))
        out[("two", name)] = _read(str(tmp / f"two-{name}"))
    return out


def _compare(theirs: dict, ours: dict, where: str) -> float:
    assert set(theirs) == set(ours), f"{where}: keys differ: only PaddleNLP's {sorted(set(theirs) - set(ours))}, only ours {sorted(set(ours) - set(theirs))}"
    worst = 0.0
    for key, value in theirs.items():
        if _clock(key):
            continue
        assert abs(value - ours[key]) <= TOLERANCE, f"{where} {key}: PaddleNLP {value!r}, ours {ours[key]!r}"
        worst = max(worst, abs(value - ours[key]))
    return worst


def test_only_the_import_line_differs():
    assert only_the_import_differs(SCRIPT) == ["-" + PADDLENLP_IMPORT, "+" + OUR_IMPORT]


@pytest.mark.parametrize("procs", ["one", "two"])
def test_every_logged_value_is_paddlenlps(runs, procs):
    theirs, ours = runs[(procs, "paddlenlp")], runs[(procs, "ours")]
    assert len(theirs["history"]) == len(ours["history"]) > 10
    worst = 0.0
    for i, (a, b) in enumerate(zip(theirs["history"], ours["history"])):
        worst = max(worst, _compare(a, b, f"{procs} process(es), log record {i} (step {a.get('step')})"))
    print(f"{procs}: {len(theirs['history'])} records, max difference {worst:.2e}")
    losses = [r["loss"] for r in ours["history"] if "loss" in r]
    assert len(set(losses)) > 5 and any(r.get("learning_rate", 0) > 0 for r in ours["history"])  # it trained
    _compare(theirs["eval"], ours["eval"], f"{procs}: evaluate()")
    assert abs(theirs["train_loss"] - ours["train_loss"]) <= TOLERANCE
    assert theirs["global_step"] == ours["global_step"]


def test_one_and_two_processes_differ(runs):
    """The two layouts see different batches: the comparison above is not one run compared with itself."""
    one = [r["loss"] for r in runs[("one", "ours")]["history"] if "loss" in r]
    two = [r["loss"] for r in runs[("two", "ours")]["history"] if "loss" in r]
    assert one[:3] != two[:3]
