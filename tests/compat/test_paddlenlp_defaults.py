"""PaddleNLP's own Trainer runs with its defaults in this project's environment. Before: with protobuf 7.36
its default ``report_to`` (VisualDL) crashed ``train()`` at the start: visualdl 2.5.3 files the boolean
arguments as hparams into an int field, which protobuf 7.34 and newer refuse (``TypeError: Field
visualdl.Record.HParam.HparamInfo.int_value: Expected an int, got a boolean``). After: setup.cfg pins protobuf
6.33.6, which every pinned package accepts and which takes the boolean (with a DeprecationWarning)."""

import glob
import os
import subprocess
import sys

from helpers import REPO
from patience import patience

SCRIPT = os.path.join(REPO, "tests", "compat", "scripts", "paddlenlp_defaults.py")


def test_paddlenlp_trainer_with_its_defaults_trains_and_writes_its_visualdl_record(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "out")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=patience(300), env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "report_to ['visualdl']" in lines and "TRAINED 3" in lines, done.stdout[-2000:]
    records = glob.glob(str(tmp_path / "out" / "runs" / "*" / "vdlrecords.*.log"))
    assert len(records) == 1 and os.path.getsize(records[0]) > 0, records

    from visualdl import LogReader

    reader = LogReader(file_path=records[0])
    assert len(reader.get_data("scalar", "train/loss")) == 3  # logging_steps=1, max_steps=3
