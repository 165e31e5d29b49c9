"""Checkpoints of a PaddleFormers script on our Trainer (tests/paddleformers/scripts/pf_finetune.py, only its
``Trainer`` import changed): a run saving every 3 steps logs what PaddleFormers' own logs (its
``{"global_save_step": N}`` records included), resumes from its step-3 checkpoint to the same numbers as
PaddleFormers' uninterrupted run, and what ``save_model`` wrote loads with PaddleFormers' ``from_pretrained``
(a full model on two processes; a LoRA adapter through ``LoRAModel.from_pretrained``).

PaddleFormers' own checkpoints (``checkpoint-N`` with ``save_checkpoint_format="unified_checkpoint"``: its
optimizer's safetensors, ``trainer_state.bin``, a pickled ``rng_state``) are not what our resume reads
(``checkpoints/step-N`` under one manifest, trainer.checkpoint): resuming a run begun under PaddleFormers'
Trainer is refused in one line naming the directory."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pf_helpers import BASE_ARGS, env, read_logs, run_script, script_source  # noqa: E402
from test_pf_numbers import TOLERANCE, compare  # noqa: E402


def _saving(argv):
    argv = list(argv) + ["--save_steps", "3", "--save_checkpoint_format", "unified_checkpoint"]
    argv[argv.index("--save_strategy") + 1] = "steps"
    return argv


def test_a_saving_run_logs_as_paddleformers_and_resumes_to_its_numbers(tmp_path):
    argv = _saving(BASE_ARGS)
    theirs = run_script(tmp_path, "theirs", False, argv)
    ours = run_script(tmp_path, "ours", True, argv)
    compare(read_logs(theirs), read_logs(ours), "saving")  # the global_save_step records too
    assert [r["global_save_step"] for r in read_logs(ours)["logs"] if "global_save_step" in r] == [3, 6]
    step3 = os.path.join(ours, "checkpoints", "step-3")
    assert os.path.isdir(step3)
    # a second run resumes from step 3: its steps 4-6 are PaddleFormers' uninterrupted run's
    resumed = run_script(tmp_path, "resumed", True, argv + ["--resume_from", step3])
    want = {r["global_step"]: r for r in read_logs(theirs)["logs"] if "loss" in r}
    got = {r["global_step"]: r for r in read_logs(resumed)["logs"] if "loss" in r}
    assert sorted(got) == [4, 5, 6]
    for step, record in got.items():
        for key in ("loss", "learning_rate", "progress_or_epoch"):
            assert abs(record[key] - want[step][key]) <= TOLERANCE, (step, key, record[key], want[step][key])


def test_their_checkpoint_is_refused_by_our_resume_in_one_line(tmp_path):
    import subprocess

    argv = _saving(BASE_ARGS)
    theirs = run_script(tmp_path, "theirs", False, argv)
    path = os.path.join(str(tmp_path), "again.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script_source(True))
    proc = subprocess.run([sys.executable, path, *argv, "--output_dir", str(tmp_path / "again"), "--resume_from",
                           os.path.join(theirs, "checkpoint-3")], cwd=str(tmp_path), env=env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert "checkpoint-3" in last, proc.stderr[-2000:]


def test_save_model_on_two_processes_and_a_lora_adapter_load_in_paddleformers(tmp_path):
    import paddle
    from paddleformers.peft import LoRAModel
    from paddleformers.transformers import LlamaForCausalLM

    full = run_script(tmp_path, "full2", True, BASE_ARGS + ["--sharding="], nproc=2)
    model = LlamaForCausalLM.from_pretrained(full)
    assert model.config.vocab_size == 64
    lora = run_script(tmp_path, "lora", True, BASE_ARGS + ["--lora", "true"])
    assert os.path.exists(os.path.join(lora, "lora_config.json"))
    # the script's base model again (the same seed), with the saved adapter
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
    from pf_finetune import tiny_model

    paddle.seed(1)
    loaded = LoRAModel.from_pretrained(tiny_model("llama"), lora)
    trained = {n: p for n, p in loaded.model.named_parameters() if "lora_B" in n}
    assert trained and any(np.abs(p.numpy()).max() > 0 for p in trained.values())  # B starts at zero: trained
