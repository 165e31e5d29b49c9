"""What the build can do, asked once before anything is launched (issue 39 item 2): on a CPU build of paddle the
layouts it cannot run are refused by the command the user typed, in one line naming the flag, exit 2, before the
launcher starts; a user's own script is refused at ``TrainingArguments(...)``; the test shims lift exactly the
rows they make run; the docs' "what runs where" table is the same rows.

The ``ptrain run`` cases are real commands in real processes (no shim on their path: PYTHONPATH is the repo only)."""

import doctest
import os
import subprocess
import sys

import pytest
from helpers import REPO
from patience import patience

import trainer.capabilities as capabilities
from trainer.capabilities import FEATURES, Capabilities, grant_for_tests, missing, where_it_runs
from trainer.errors import ConfigError
from trainer.layout import Layout


def _cpu_build() -> bool:
    import paddle

    return not (paddle.device.is_compiled_with_cuda() or paddle.device.is_compiled_with_xpu()
                or paddle.device.get_all_custom_device_type())


needs_cpu_build = pytest.mark.skipif(not _cpu_build(), reason="this build of paddle runs these layouts")


@pytest.fixture
def unshimmed(monkeypatch):
    """This process's table as the product sees it: without what a test shim installed earlier in this worker
    granted (``grant_for_tests``)."""
    monkeypatch.setattr(capabilities, "_granted", {})
    monkeypatch.setattr(capabilities, "_probed", {})


@needs_cpu_build
@pytest.mark.parametrize("flags, named", [
    (["--sharding", "stage2"], "--sharding stage2 needs a GPU"),
    (["--sharding", "stage3 offload"], "--sharding stage3 offload needs a GPU"),
    (["--tensor_parallel_degree", "2"], "--tensor_parallel_degree 2 needs a GPU"),
    (["--pipeline_parallel_degree", "2"], "--pipeline_parallel_degree 2 needs a GPU"),
    (["--sharding", "stage1", "--sharding_parallel_config", "split_param"],
     "--sharding_parallel_config split_param needs a GPU"),
    (["--sharding", "stage1", "--sharding_parallel_config", "enable_stage1_overlap"],
     "--sharding_parallel_config enable_stage1_overlap needs a GPU"),
    (["--gpus", "0,1"], "--gpus 0,1 needs GPUs"),
])
def test_ptrain_run_refuses_what_the_build_cannot_run_in_one_line_before_launching(tmp_path, flags, named):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "digits", "--nproc", "2", "--output_dir",
                           str(out), "--max_steps", "2", *flags], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO), timeout=patience(120))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptrain: error: ") and named in lines[0], done.stderr[-3000:]
    assert "ptrain: launching" not in done.stderr and not out.exists()  # nothing started, nothing written


@needs_cpu_build
@pytest.mark.parametrize("flags, named", [
    (["--gpus", "0,1,2,3"], "--gpus 0,1,2,3 needs GPUs"),
    (["--nproc", "2"], "the workers' log folder log is a file"),  # `ptrain launch ... | tee log` made ./log
])
def test_ptrain_launch_refuses_in_one_line_before_launching(tmp_path, flags, named):
    """ptrain launch, whose script holds the arguments, refuses its own flags as ptrain run does: --gpus on a
    build without GPUs (it launched and failed with paddle's traceback, exit 1), and a log folder that is a file."""
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    (tmp_path / "log").write_text("what tee wrote\n")
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "launch", *flags, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=patience(120))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptrain: error: ") and named in lines[0], done.stderr[-3000:]
    assert not (tmp_path / "ran").exists() and (tmp_path / "log").read_text() == "what tee wrote\n"


@needs_cpu_build
def test_a_users_script_is_refused_at_training_arguments(unshimmed, tmp_path):
    from trainer import TrainingArguments

    with pytest.raises(ConfigError, match=r'^pipeline_parallel_degree=2 needs a GPU .*set pipeline_parallel_degree=1$'):
        TrainingArguments(output_dir=str(tmp_path), pipeline_parallel_degree=2)
    with pytest.raises(ConfigError, match=r'^tensor_parallel_degree=2 needs a GPU'):
        TrainingArguments(output_dir=str(tmp_path), tensor_parallel_degree=2)
    TrainingArguments(output_dir=str(tmp_path), sharding="stage3")  # one process: sharding is a no-op, it runs


def test_what_each_build_runs():
    cpu, gpu = Capabilities(device="cpu"), Capabilities(device="gpu", compiled=("cuda",))
    asked = {"sharding stage1": Layout.plan(2, sharding="stage1"), "sharding stage2": Layout.plan(2, sharding="stage2"),
             "tensor parallel": Layout.plan(2, tensor_parallel_degree=2),
             "pipeline parallel": Layout.plan(2, pipeline_parallel_degree=2),
             "recompute": Layout.plan(2, recompute=True)}
    assert {name: [f.name for f in missing(cpu, layout)] for name, layout in asked.items()} == {
        "sharding stage1": [], "sharding stage2": ["sharding stage2"], "tensor parallel": ["tensor parallel"],
        "pipeline parallel": ["pipeline parallel"], "recompute": []}
    assert all(missing(gpu, layout) == [] for layout in asked.values())
    assert {"reduce_scatter", "alltoall", "calc_stream"}.isdisjoint(cpu.operations)  # measured on paddle 3.3.1's gloo
    fused = Layout.plan(2, sharding="stage1", sharding_parallel_config="enable_stage1_tensor_fusion split_param")
    assert [f.name for f in missing(cpu, fused)] == ["stage1 tensor fusion, overlap", "stage1 split_param"]
    assert missing(cpu, Layout.plan(2, sharding="stage1", sharding_parallel_config="disable_stage1_reduce_avg")) == []
    assert missing(cpu, Layout.plan(1, sharding="stage3")) == []  # one process: no group_sharded at all


def test_a_shim_lifts_exactly_the_rows_it_names(unshimmed):
    grant_for_tests(["sharding stage2"], by="a test")
    caps = capabilities.probe("cpu")
    assert missing(caps, Layout.plan(2, sharding="stage2")) == []
    assert [f.name for f in missing(caps, Layout.plan(2, sharding="stage3"))] == ["sharding stage3"]
    with pytest.raises(ValueError, match="not a feature"):
        grant_for_tests(["stage 2"], by="a test")


def test_the_docs_table_is_generated_from_the_same_rows():
    sys.path.insert(0, os.path.join(REPO, "docs", "hooks"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    page = open(os.path.join(REPO, "docs", "how-to", "large-models.md"), encoding="utf-8").read()
    assert "<!-- generated: what-runs-where -->" in page
    table = generate.expand("<!-- generated: what-runs-where -->")
    assert table == where_it_runs()
    for feature in FEATURES:
        assert f"| {feature.name} |" in table
    assert "| sharding stage2 | `sharding` | runs | refused (exit 2): needs a GPU |" in table


def test_docstring_examples():
    result = doctest.testmod(capabilities)
    assert result.failed == 0 and result.attempted > 0
