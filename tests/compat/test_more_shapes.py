"""Two more PaddleNLP script shapes move with one import (tests/compat/scripts/more_shapes.py):
extractive QA (start and end logits: a tuple of per-batch-length outputs, two label columns via
label_names) and a multi-label head trained by a Trainer subclass that overrides compute_loss.

Each shape trains under PaddleNLP's Trainer and ours (same data, same seed): the metrics are
compared side by side. Then the model PaddleNLP trained is evaluated by both: predictions, labels
and metrics equal.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest

# found, not imported: collecting the suite must not import paddlenlp in every worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import (OUR_IMPORT, PADDLENLP_IMPORT, make_tiny_ernie, only_the_import_differs,  # noqa: E402
                            run_script, script_source, write_tagging_data)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "more_shapes.py")
SHAPES = {"qa": (["--label_names", "start_positions", "end_positions"], {"eval_exact_match": 0.15, "eval_start_accuracy": 0.15}),
          "multilabel": ([], {"eval_micro_f1": 0.05})}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    return tmp, make_tiny_ernie(str(tmp / "ernie")), write_tagging_data(str(tmp / "data"))


def _run(tmp, name, ours, argv):
    out = str(tmp / name)
    summary = run_script(script_source(ours, script=SCRIPT), argv + ["--output_dir", out], str(tmp), name)
    with np.load(os.path.join(out, "predictions.npz")) as z:
        return summary, {k: z[k] for k in z.files}


def test_only_the_import_line_differs():
    assert only_the_import_differs(SCRIPT) == ["-" + PADDLENLP_IMPORT, "+" + OUR_IMPORT]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_shape_under_both_trainers(shape, data):
    tmp, ernie, data_dir = data
    extra, tolerance = SHAPES[shape]
    common = ["--data_dir", data_dir, "--shape", shape, *extra, "--report_to", "none", "--disable_tqdm", "true",
              "--device", "cpu", "--seed", "42", "--per_device_eval_batch_size", "8", "--evaluation_strategy", "no",
              "--save_strategy", "no"]
    train = ["--model_name_or_path", ernie, "--do_train", "--num_train_epochs", "2", "--learning_rate", "5e-3",
             "--per_device_train_batch_size", "16", "--logging_steps", "5"]
    trained = {name: _run(tmp, f"{shape}_train_{name}", ours, common + train)[0]
               for name, ours in (("paddlenlp", False), ("ours", True))}
    print(shape, {name: s["eval"] for name, s in trained.items()})
    assert trained["ours"]["global_step"] == trained["paddlenlp"]["global_step"] == 40
    for metric, within in tolerance.items():
        assert abs(trained["ours"]["eval"][metric] - trained["paddlenlp"]["eval"][metric]) <= within, metric
    evaluate = common + ["--model_name_or_path", str(tmp / f"{shape}_train_paddlenlp")]
    (s_theirs, theirs), (s_ours, ours) = (_run(tmp, f"{shape}_eval_{name}", o, evaluate)
                                          for name, o in (("paddlenlp", False), ("ours", True)))
    assert sorted(ours) == sorted(theirs) == (["label0", "label1", "pred0", "pred1"] if shape == "qa" else ["label0", "pred0"])
    for key in theirs:
        assert ours[key].shape == theirs[key].shape, key
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-5, err_msg=key)
    for metric, value in s_theirs["eval"].items():
        if metric != "progress_or_epoch":
            assert s_ours["eval"][metric] == pytest.approx(value, rel=1e-5), metric
            assert type(s_ours["eval"][metric]) is type(value), metric  # an int stays an int (true_positives)
