"""ResNet on a CPU machine: nvImageCodec loads only its CPU extensions. Before: every ResNet run printed 3-7
"[ERROR] ... Failed to load nvJPEG library" lines where CUDA's nvJPEG is absent (nvImageCodec probed its GPU
decoders in each process that decodes). After: without a GPU, ``NVIMGCODEC_EXTENSIONS_PATH`` names a folder of
the CPU extensions only, so the nvJPEG extension is never loaded; the decoded pixels are the same; with a GPU
(or a path the user set) nothing changes.

Judged by what the process loaded (the extension libraries mapped into it, and the folder nvImageCodec was
pointed at), never by nvImageCodec's stderr: with every extension (the user's own path) nvImageCodec prints
"Failed to load nvJPEG library" wherever the nvjpeg wheel is missing (a fresh venv of the README's set-up),
which an earlier version of this test mistook for a failure of ours (3 of 3 failed there)."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from patience import patience
from PIL import Image

from models.resnet import jpeg_regions

pytestmark = pytest.mark.skipif(not jpeg_regions.available(), reason="nvImageCodec not installed")

PROBE = """
import json, os, sys
import numpy as np
from models.resnet import jpeg_regions
data = open(sys.argv[1], 'rb').read()
(region,) = jpeg_regions.decode_regions([data], [(3, 5, 40, 50)], fast=False)
# the shared libraries of nvImageCodec's extensions that this process loaded (the OS's own record)
loaded = sorted({os.path.basename(line.split()[-1]).split('.so')[0] for line in open('/proc/self/maps')
                 if '_ext.so' in line and 'nvimgcodec' in line})
folder = os.environ.get('NVIMGCODEC_EXTENSIONS_PATH')
print(json.dumps({'loaded': loaded, 'folder': folder,
                  'files': sorted(os.listdir(folder)) if folder else None, 'sum': int(region.astype('int64').sum()),
                  'shape': list(region.shape)}))
"""


def _probe(tmp_path, env_path=None):
    img = (np.random.RandomState(0).rand(64, 80, 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    (tmp_path / "x.jpg").write_bytes(buf.getvalue())
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("NVIMGCODEC_EXTENSIONS_PATH", None)
    if env_path:
        env["NVIMGCODEC_EXTENSIONS_PATH"] = env_path
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "x.jpg")], env=env, capture_output=True,
                          text=True, timeout=patience(120))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_gpu_only_cpu_extensions_load_and_the_pixels_are_the_same(tmp_path):
    import paddle

    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("a GPU machine keeps every extension (benchmarks/gpu_check.py)")
    cpu = _probe(tmp_path)
    assert "libjpeg_turbo_ext" in cpu["loaded"], cpu  # the decoder that ran
    assert all(name.startswith(jpeg_regions.CPU_EXTENSIONS) for name in cpu["loaded"]), cpu  # no GPU extension
    assert cpu["files"] and all(f.startswith(jpeg_regions.CPU_EXTENSIONS) for f in cpu["files"])
    spec_dir = os.path.join(os.path.dirname(jpeg_regions._nvimgcodec().__file__), "extensions")
    every = _probe(tmp_path, env_path=spec_dir)  # a path the user set is left alone: every extension is offered
    assert every["folder"] == spec_dir and any(f.startswith("libnvjpeg_ext") for f in every["files"])
    assert "libjpeg_turbo_ext" in every["loaded"], every
    assert (cpu["sum"], cpu["shape"]) == (every["sum"], every["shape"]) and cpu["shape"] == [37, 45, 3]


def test_with_a_gpu_or_a_users_path_nothing_changes(monkeypatch):
    monkeypatch.delenv("NVIMGCODEC_EXTENSIONS_PATH", raising=False)
    assert jpeg_regions.cpu_only_extensions(gpu=True) is None and "NVIMGCODEC_EXTENSIONS_PATH" not in os.environ
    monkeypatch.setenv("NVIMGCODEC_EXTENSIONS_PATH", "/somewhere")
    assert jpeg_regions.cpu_only_extensions(gpu=False) is None and os.environ["NVIMGCODEC_EXTENSIONS_PATH"] == "/somewhere"
