"""``ptrain verify-resume`` on the digits task: real processes, real checkpoints.

One check (uninterrupted and interrupted runs in parallel, then the resume)
finds the runs identical bit for bit; the same check with the resumed half
shuffling by another data_seed reuses the first two runs and is refused by the
resumed run (trainer.checkpoint.resume); compare_records is tested on its own.
"""

import json
import os

import pytest
from patience import patience

from trainer.errors import ConfigError
from trainer.cli.verify_resume import RunFailed, compare_records, verify_resume

# dropout on, so the RNG state must travel in the checkpoint too
OVERRIDES = ["--hidden_size", "32", "--dropout", "0.2", "--evaluation_strategy", "no"]
N = 6


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("verify"))


def test_resumed_run_is_identical(workdir):
    ok, report = verify_resume("digits", None, OVERRIDES, N, workdir, parallel=True, timeout=patience(120))
    assert ok, report
    assert "RESULT: identical (bitwise)" in report
    assert f"step-{2 * N} model: 4 tensors" in report
    assert "SIGTERM after step 6" in report
    # the interrupted run really was preempted at N and the resumed one went on from there
    with open(os.path.join(workdir, "interrupted", "checkpoints", "latest")) as f:
        assert f.read().strip() == f"step-{N}"
    assert not os.path.exists(os.path.join(workdir, "interrupted", "checkpoints", f"step-{2 * N}"))
    with open(os.path.join(workdir, "resumed", "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if '"loss"' in line]
    assert steps == list(range(1, 2 * N + 1))


def test_a_resume_with_a_changed_setting_is_refused_in_one_line(workdir):
    # a changed data_seed would shuffle the rest of the run differently: the resumed run refuses it (exit 2)
    if not os.path.isfile(os.path.join(workdir, "interrupted.json")):
        pytest.skip("needs the runs of test_resumed_run_is_identical")
    with pytest.raises(RunFailed, match=r"the resumed run failed \(exit code 2\): ptrain: error: resume: data_seed "
                                        r"was 0 in checkpoint .*, this run has 5") as info:
        verify_resume("digits", None, OVERRIDES, N, workdir, resume_overrides=["--data_seed", "5"], reuse=True,
                      timeout=patience(120))
    assert info.value.exit_code == 2


def test_controlled_fields_cannot_be_overridden(tmp_path):
    with pytest.raises(ConfigError, match="verify-resume sets --save_steps itself"):
        verify_resume("digits", None, ["--save_steps", "3"], 2, str(tmp_path))
    with pytest.raises(ConfigError, match="give an integer N >= 1"):
        verify_resume("digits", None, [], 0, str(tmp_path))


def test_a_failing_run_is_reported_with_its_exit_code_and_message(tmp_path):
    with pytest.raises(RunFailed, match=r"the uninterrupted run failed \(exit code 2\): ptrain: error: "
                                        r"learning_rate=.* is not allowed") as info:
        verify_resume("digits", None, ["--learning_rate", "-1"], 2, str(tmp_path), timeout=patience(120))
    assert info.value.exit_code == 2
    assert not os.path.exists(tmp_path / "resumed")


def test_compare_records_names_the_first_difference():
    a = [(1, {"loss": 1.0}), (2, {"loss": 0.5, "learning_rate": 0.1})]
    assert compare_records(a, list(a)) is None
    assert compare_records(a, [(1, {"loss": 1.0}), (2, {"loss": 0.25, "learning_rate": 0.1})]) == \
        "step 2: loss 0.5 (uninterrupted) vs 0.25 (resumed), |diff| 0.25"
    assert compare_records(a, a[:1]).startswith("step 2: only the uninterrupted run logged")
    assert compare_records([(1, {"loss": float("nan")})], [(1, {"loss": float("nan")})]) is None
