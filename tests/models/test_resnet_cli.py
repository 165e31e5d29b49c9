"""``ptrain run resnet50`` and ``ptrain predict resnet50`` as a user runs them:
real subprocesses, real files (a few steps of ResNet-18 on the embedded digits)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

FAST = ["--depth", "18", "--image_size", "32", "--disable_tqdm", "true", "--per_device_train_batch_size", "16"]


def ptrain(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO))


def test_run_writes_results_and_an_inference_model_that_predict_uses(tmp_path):
    out = ptrain("run", "resnet50", "--max_steps", "4", "--output_dir", "run", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    for key in ("eval_accuracy", "test_accuracy", "eval_top5_accuracy", "test_top5_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    assert results["depth"] == 18 and results["dataset"] == "digits" and results["test_samples"] == 360
    assert "test_accuracy=" in out.stdout and "run directory:" in out.stdout
    inference = tmp_path / "run" / "inference"
    assert {"model.json", "model.pdiparams", "export.json", "preprocess.json"} <= set(os.listdir(inference))
    pre = json.loads((inference / "preprocess.json").read_text())
    assert pre["image_size"] == 32 and pre["class_names"] == [str(d) for d in range(10)]

    # two PNGs of test digits: one at the network's size, one larger (predict resizes)
    from models.resnet.data import render_digits, stratified_split
    from trainer.deploy.predictor import create_predictor, run_predictor

    images, labels = render_digits(32)
    test_index = stratified_split(labels, 0.1, 0.2, seed=0)[2][:2]
    Image.fromarray(images[test_index[0]]).save(tmp_path / "a.png")
    Image.fromarray(images[test_index[1]]).resize((96, 96)).save(tmp_path / "b.png")
    out = ptrain("predict", "resnet50", "--model", str(inference), "a.png", "b.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["input"] for r in rows] == ["a.png", "b.png"]
    for row in rows:
        assert row["label"] in pre["class_names"] and len(row["top5"]) == 5
        assert row["top5"][0] == [row["label"], row["score"]] and 0 < row["score"] <= 1
    # predict's preprocessing is the evaluation pipeline: same logits as the dataset's own test sample
    from models.resnet.transforms import ToCHW

    (logits,) = run_predictor(create_predictor(str(inference)), [ToCHW()(images[test_index[0]])[None]])
    assert rows[0]["label"] == str(int(np.argmax(logits[0])))

    assert "looks inverted" not in out.stderr  # the test digits are white on black

    bad = ptrain("predict", "resnet50", "--model", str(inference), "missing.png", cwd=tmp_path)
    assert bad.returncode == 3 and "missing.png" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_imagefolder_run_with_a_corrupt_file_fails_naming_it(tmp_path):
    rng = np.random.RandomState(0)
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            os.makedirs(tmp_path / "data" / split / c)
            for i in range(4):
                Image.fromarray(rng.randint(0, 256, (40, 48, 3)).astype("uint8")).save(tmp_path / "data" / split / c / f"{i}.png")
    (tmp_path / "data" / "train" / "dog" / "1.png").write_bytes(b"\x89PNG broken")
    out = ptrain("run", "resnet50", "--data_dir", "data", "--image_size", "32", "--max_steps", "2", "--bad_images", "fail",
                 "--dataloader_num_workers", "2", "--output_dir", "run", *FAST, cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-3000:]  # a DataError, raised in the main process
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ptrain: error:") and os.path.join("train", "dog", "1.png") in last, last


def test_two_processes_evaluate_every_sample_once(tmp_path):
    out = ptrain("run", "resnet50", "--nproc", "2", "--max_steps", "2", "--output_dir", "dp", *FAST, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "dp" / "results.json").read_text())
    assert results["status"] == "completed" and results["eval_samples"] == 180 and results["test_samples"] == 360
    assert "test_accuracy" in results and os.path.isfile(tmp_path / "dp" / "inference" / "preprocess.json")


def test_unknown_option_and_missing_data_dir_are_one_line_errors(tmp_path):
    out = ptrain("run", "resnet50", "--recipe", "imagenet", cwd=tmp_path)
    assert out.returncode == 2 and "--data_dir" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_resnet50_demo_is_a_resnet50_and_list_says_what_each_recipe_trains(tmp_path):
    out = ptrain("run", "resnet50", "--dry_run", "--output_dir", "x", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("info: "))[6:])
    assert info["depth"] == 50 and info["parameters"] == 23528522  # paddle.vision resnet50, 10 classes
    out = ptrain("run", "resnet", "--recipe", "demo18", "--dry_run", "--output_dir", "x", cwd=tmp_path)
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("info: "))[6:])
    assert info["depth"] == 18 and info["image_size"] == 32
    listed = ptrain("list", cwd=tmp_path).stdout
    assert "ResNet-18/34/50/101/152" in listed and "demo: ResNet-50" in listed and "demo18" in listed


def test_predict_help_says_what_each_task_expects(tmp_path):
    out = ptrain("predict", "--help", cwd=tmp_path)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "white digit on a black background" in text and "resnet50:" in text and "ernie: Texts" in text
