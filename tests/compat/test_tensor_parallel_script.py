"""A PaddleNLP script with tensor parallel (tests/compat/scripts/tensor_parallel_llama.py: PaddleNLP's
TrainingArguments with ``--tensor_parallel_degree 2``, a LlamaForCausalLM whose config takes the degree and rank
from them) runs on this project's Trainer with the Trainer import changed, on 2 gloo processes, and logs the
losses of the same script on one process.

PaddleNLP's own Trainer stops there on CPU (fleet's input broadcast asserts a GPU), hence the one-process
reference. The 2 processes get the test-only shim through tests/parallel/shim_site (sitecustomize, switched on
by PTRAIN_TEST_HYBRID_SHIM=1): paddle's GPU-only paths of tensor parallel, and ``c_concat`` (the logits gathered
over the tensor-parallel ranks), with the same arithmetic.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("paddlenlp") is None, reason="paddlenlp not installed")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_helpers import only_the_import_differs, script_source  # noqa: E402
from helpers import REPO, free_port, run_launch  # noqa: E402
from patience import patience  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "tensor_parallel_llama.py")
SHIM_SITE = os.path.join(REPO, "tests", "parallel", "shim_site")
ARGS = ["--max_steps", "4", "--per_device_train_batch_size", "8", "--logging_steps", "1", "--learning_rate", "1e-3",
        "--report_to", "none", "--device", "cpu", "--save_strategy", "no", "--disable_tqdm", "true"]


def whole_weights(path):
    """Random whole weights of the script's Llama, one file for every layout."""
    code = ("import numpy as np, sys\n"
            "from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM\n"
            "m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,"
            " num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))\n"
            "rng = np.random.RandomState(0)\n"
            "np.savez(sys.argv[1], **{k: (np.ones(v.shape) if 'norm' in k else rng.standard_normal(v.shape) * 0.2)"
            ".astype('float32') for k, v in m.state_dict().items()})\n")
    subprocess.run([sys.executable, "-c", code, path], check=True, capture_output=True, timeout=patience(300))


def test_paddlenlp_tensor_parallel_script_runs_with_the_import_changed(tmp_path):
    assert len(only_the_import_differs(SCRIPT)) == 2
    script = tmp_path / "tp_llama.py"
    script.write_text(script_source(ours=True, script=SCRIPT), encoding="utf-8")
    weights = str(tmp_path / "weights.npz")
    whole_weights(weights)
    env = dict(os.environ, PYTHONPATH=REPO, TP_WEIGHTS=weights)
    one = subprocess.run([sys.executable, str(script), "--output_dir", str(tmp_path / "one"), *ARGS], env=env,
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=patience(300))
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_launch([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
                      f"127.0.0.1:{free_port()}", "--log_dir", str(tmp_path / "logs"), str(script),
                      "--output_dir", str(tmp_path / "two"), "--tensor_parallel_degree", "2", *ARGS],
                     str(tmp_path / "logs"),
                     env=dict(env, PYTHONPATH=REPO + os.pathsep + SHIM_SITE, PTRAIN_TEST_HYBRID_SHIM="1"),
                     cwd=str(tmp_path), timeout=400)
    logs = "".join((tmp_path / "logs" / f).read_text(errors="replace")[-2000:]
                   for f in sorted(os.listdir(tmp_path / "logs")) if f.startswith("workerlog"))
    assert two.returncode == 0, two.stderr[-2000:] + logs
    assert "parallel layout: 2 ranks: dp 1 x mp 2" in logs
    losses = [json.loads((tmp_path / run / "summary-0.json").read_text())["losses"] for run in ("one", "two")]
    assert len(losses[0]) == 4
    diff = float(np.abs(np.array(losses[0]) - np.array(losses[1])).max())
    print(f"PARITY paddlenlp llama mp2: max loss difference {diff:.3g}")
    # relative: these losses are ~4.6, where float32's spacing is 4.8e-7; split matmuls summed over 2 ranks round
    # differently with the CPU's kernels (1.4e-6, 3 spacings, on an Intel Xeon; <= 1e-6 on an AMD EPYC). 2e-6 of
    # the loss is ~19 spacings, as 1e-6 is at the ERNIE tests' losses of ~0.7; a wrong shard is off by ~1e-2.
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-6, atol=0)
