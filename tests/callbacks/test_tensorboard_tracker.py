"""report_to tensorboard: real runs read back with TensorBoard's own EventAccumulator; a resume from an
earlier checkpoint continues the same curve (the steps after the checkpoint replaced, not doubled); the
writer without tensorboardX is TensorBoard's own and still writes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tracker_runs import logged, tracker, train, write_results  # noqa: E402

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: pip install 'paddle-trainer[tensorboard]'")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from callbacks.tensorboard_tracker import TensorBoardTracker  # noqa: E402


def read(logdir):
    events = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def scalars(events, tag):
    return {e.step: e.value for e in events.Scalars(tag)}


def texts(events, tag):
    return [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in events.Tensors(tag + "/text_summary")]


def session_start(events):
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams


def test_scalars_hparams_and_artifacts_read_back_and_a_resume_continues_the_curve(tmp_path):
    pytest.importorskip("tensorboardX", reason="tensorboardX (in the tensorboard extra) is not installed")
    out = tmp_path / "run"
    first = train(out, ["tensorboard"], stop_at=6, run_name="exp1")  # logs 2, 4, 6; saves 2, 4, 6
    tb = tracker(first, TensorBoardTracker)
    logdir = str(out / "tensorboard" / "exp1")  # run_name: TensorBoard's run directory
    assert tb.writer_kind == "tensorboardX" and tb.run_id == logdir
    # resumed from step 4: steps 6 and 8 come from the second run; step 6 of the first is dropped
    second = train(out, ["tensorboard"], resume=str(out / "checkpoints" / "step-4"), run_name="exp1")
    assert tracker(second, TensorBoardTracker).run_id == logdir  # the same run, from the checkpoint
    write_results(second)

    events = read(logdir)
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]  # step 6 once: the first run's was purged
    loss = scalars(events, "train/loss")
    expected = {**{s: v for s, v in logged(first, "loss").items() if s <= 4}, **logged(second, "loss")}
    assert loss == pytest.approx(expected, rel=1e-6)
    assert scalars(events, "eval/loss") == pytest.approx(logged(second, "eval_loss") | {3: logged(first, "eval_loss")[3]}, rel=1e-6)
    assert "train/learning_rate" in events.Tags()["scalars"]
    hp = session_start(events)
    assert hp["learning_rate"].number_value == pytest.approx(0.05) and hp["run_name"].string_value == "exp1"
    assert "wandb_api_key" not in hp
    assert texts(events, "artifacts/model")[-1] == f"exported model: {out / 'inference'}"
    assert '"global_step": 8' in texts(events, "artifacts/results.json")[0]
    assert "| learning_rate | 0.05 |" in texts(events, "args")[0]


def test_without_tensorboardX_tensorboards_own_writer_writes(tmp_path, monkeypatch):
    """PaddleNLP's report_to tensorboard with only tensorboard installed writes nothing; here it writes."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if not installed: find_spec None, import fails
    out = tmp_path / "run"
    first = train(out, ["tensorboard"], max_steps=6)
    tb = tracker(first, TensorBoardTracker)
    assert tb.writer_kind == "tensorboard"
    events = read(tb.run_id)
    assert tb.run_id == str(out / "tensorboard")
    assert scalars(events, "train/loss") == pytest.approx(logged(first, "loss"), rel=1e-6)
    assert scalars(events, "eval/loss") == pytest.approx(logged(first, "eval_loss"), rel=1e-6)
    assert session_start(events)["max_steps"].number_value == 6


def test_logging_dir_moves_the_events(tmp_path):
    pytest.importorskip("tensorboardX", reason="tensorboardX (in the tensorboard extra) is not installed")
    trainer = train(tmp_path / "run", ["tensorboard"], max_steps=4, logging_dir=str(tmp_path / "logs"))
    assert tracker(trainer, TensorBoardTracker).run_id == str(tmp_path / "logs" / "tensorboard")
    assert sorted(scalars(read(str(tmp_path / "logs" / "tensorboard")), "train/loss")) == [2, 4]
    assert not os.path.exists(tmp_path / "run" / "tensorboard")
