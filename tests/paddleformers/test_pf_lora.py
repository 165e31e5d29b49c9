"""LoRA through our own TrainingArguments: a PaddleFormers causal LM wrapped in ``paddleformers.peft.LoRAModel``,
trained by ``Trainer(model, TrainingArguments(...))`` (not the door).

Only the LoRA tensors change; a resume continues bitwise as an uninterrupted run (it restored nothing before
``trainer.layout.adapters.set_state``: a LoRAModel's own ``set_state_dict`` skips its wrapper's names); our
checkpoint holds the whole model and the adapter's optimizer state, and records the adapter; ``save_model``
writes what ``LoRAModel.from_pretrained`` loads; export writes the base model with the adapter merged in, which
predicts as the LoRA model does within 1e-5; ``ptrain inspect`` shows the adapter.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from paddleformers.peft import LoRAConfig, LoRAModel
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

from trainer import ConfigError, Trainer, TrainingArguments
from trainer.checkpoint.manifest import safetensors_header
from trainer.layout.adapters import merged

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGETS = [".*q_proj", ".*v_proj"]
PAGE = "docs/how-to/lora.md"
RUNNABLE = re.compile(r"^<!-- runnable: paddleformers -->\n```python\n(.*?)^```", re.M | re.S)


def tiny_llama() -> LlamaForCausalLM:
    paddle.seed(1)  # the same base weights every time
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                        fuse_rms_norm=False))


def lora_llama() -> LoRAModel:
    # dropout on the adapter: a resume must restore the RNG too
    return LoRAModel(tiny_llama(), LoRAConfig(target_modules=TARGETS, r=4, lora_alpha=8, lora_dropout=0.1))


class Tokens(paddle.io.Dataset):
    def __init__(self, n=32):
        self.x = np.random.RandomState(0).randint(0, 64, (n, 16)).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def train(out, max_steps=12, resume=None, model=None) -> Trainer:
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=max_steps,
                             logging_steps=1, learning_rate=1e-2, warmup_steps=2, save_steps=5, report_to=[])
    trainer = Trainer(model if model is not None else lora_llama(), args, train_dataset=Tokens())
    trainer.fit(resume_from_checkpoint=resume)
    return trainer


def logits(model, ids: np.ndarray) -> np.ndarray:
    model.eval()
    with paddle.no_grad():
        out = model(input_ids=paddle.to_tensor(ids))
    return (out[0] if isinstance(out, (tuple, list)) else out.logits).numpy()


def state(model) -> dict:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 12-step LoRA run (checkpoints at steps 5 and 10, and 12 at the end)."""
    out = tmp_path_factory.mktemp("lora")
    model = lora_llama()
    before = state(model)
    return out, before, train(out, model=model)


def test_only_the_lora_tensors_change(run):
    _, before, trainer = run
    after = state(trainer.model)
    changed = sorted(k for k in after if not np.array_equal(before[k], after[k]))
    lora = sorted(k for k in after if ".lora_A" in k or ".lora_B" in k)
    assert len(lora) == 8  # q_proj and v_proj of 2 layers, A and B each
    assert changed == lora
    assert {n for n, p in trainer.model.named_parameters() if not p.stop_gradient} == set(lora)


def test_a_resumed_run_continues_bitwise(run, tmp_path):
    _, _, full = run
    train(tmp_path, max_steps=12)  # writes step-5, then resumed from it in a fresh trainer and model
    resumed = train(tmp_path, max_steps=12, resume=str(tmp_path / "checkpoints" / "step-5"))
    logged = {r["step"]: (r["loss"], r["learning_rate"]) for r in full.state.log_history if "loss" in r}
    again = {r["step"]: (r["loss"], r["learning_rate"]) for r in resumed.state.log_history if "loss" in r}
    assert sorted(again) == list(range(1, 13))  # steps 1-5 from the checkpoint's history, 6-12 trained again
    assert again == logged
    want, got = state(full.model), state(resumed.model)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_resume_with_the_adapter_built_otherwise_is_refused_in_one_line(run, tmp_path):
    out, _, _ = run
    other = LoRAModel(tiny_llama(), LoRAConfig(target_modules=TARGETS, r=4, lora_alpha=16, lora_dropout=0.1))
    with pytest.raises(ConfigError) as refused:  # same names and shapes: only the record tells
        train(tmp_path, resume=str(out / "checkpoints" / "step-5"), model=other)
    assert str(refused.value).startswith("resume: the LoRA adapter's lora_alpha was 8 in checkpoint ")
    assert "this run's model has 16" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="written by a model with a LoRA adapter, this run's model has none"):
        train(tmp_path, resume=str(out / "checkpoints" / "step-5"), model=tiny_llama())


def test_the_checkpoint_holds_the_adapter_its_moments_and_a_record_of_the_frozen_base(run):
    out, _, trainer = run
    ckpt = out / "checkpoints" / "step-10"
    model_header, _ = safetensors_header(str(ckpt / "model.safetensors"))
    opt_header, _ = safetensors_header(str(ckpt / "optimizer.safetensors"))
    lora = {k for k in trainer.model.state_dict() if "lora_" in k}
    assert set(model_header) - {"__metadata__"} == lora  # what training changes; the base is the script's to load
    moments = {k for k in opt_header if k.startswith("param:")}
    assert {name for name in lora if any(k.startswith(f"param:{name}_") for k in moments)} == lora
    assert all(any(k.startswith(f"param:{name}_") for name in lora) for k in moments)  # no frozen weight's moments
    with open(ckpt / "trainer.json", encoding="utf-8") as f:
        meta = json.load(f)
    adapter, base = meta["adapter"], meta["frozen_base"]
    params = list(trainer.model.parameters())
    frozen = [p for p in params if p.stop_gradient]
    assert (base["tensors"], base["elements"]) == (len(frozen), sum(int(np.prod(p.shape)) for p in frozen))
    assert adapter["type"] == "LoRA" and adapter["r"] == 4 and adapter["lora_alpha"] == 8
    assert adapter["scaling"] == 2.0 and adapter["target_modules"] == TARGETS and adapter["adapted_layers"] == 4
    assert adapter["trainable_parameters"] == sum(int(np.prod(p.shape)) for p in params if not p.stop_gradient)
    assert adapter["total_parameters"] == sum(int(np.prod(p.shape)) for p in params)


def test_save_model_writes_what_paddleformers_loads(run, tmp_path):
    _, _, trainer = run
    trainer.save_model(str(tmp_path / "adapter"))
    files = set(os.listdir(tmp_path / "adapter"))
    assert "lora_config.json" in files and any(f.startswith("peft_model") and f.endswith(".safetensors") for f in files)
    loaded = LoRAModel.from_pretrained(tiny_llama(), str(tmp_path / "adapter"))
    trained_b = trainer.model.state_dict()["model.model.layers.0.self_attn.q_proj.lora_B"].numpy()
    assert np.abs(trained_b).max() > 0  # a fresh adapter's B is zero: equal logits mean the adapter was loaded
    ids = Tokens().x[:3]
    np.testing.assert_array_equal(logits(loaded, ids), logits(trainer.model, ids))


def test_export_writes_the_base_model_with_the_adapter_merged_in(run, tmp_path):
    _, _, trainer = run
    before = state(trainer.model)
    ids = Tokens().x[:3]
    want = logits(trainer.model, ids)
    path = trainer.export(str(tmp_path / "inference"))
    from trainer.deploy.predictor import create_predictor, run_predictor

    (got,) = run_predictor(create_predictor(path), [ids])
    assert np.abs(got - want).max() <= 1e-5
    with open(os.path.join(path, "export.json"), encoding="utf-8") as f:
        assert json.load(f)["max_abs_diff"] <= 1e-5
    # what was exported: the base model's class and tensors, the adapter merged into the targets' weights
    twin = merged(trainer.model)
    assert type(twin) is LlamaForCausalLM and set(twin.state_dict()) == set(tiny_llama().state_dict())
    q = "model.model.layers.0.self_attn.q_proj."
    np.testing.assert_allclose(twin.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy(),
                               before[q + "weight"] + before[q + "lora_A"] @ before[q + "lora_B"] * 2.0, atol=1e-6)
    exported = [list(p.shape) for p in paddle.jit.load(os.path.join(path, "model")).parameters()]
    assert [32, 4] not in exported and [4, 32] not in exported  # no lora_A (in x r), no lora_B (r x out)
    base = sum(int(np.prod(p.shape)) for p in tiny_llama().parameters())
    lora = sum(int(np.prod(p.shape)) for p in trainer.model.parameters() if not p.stop_gradient)
    assert base <= sum(int(np.prod(s)) for s in exported) < base + lora  # the base's weights (and a buffer or two)
    after = state(trainer.model)  # the trained model is left as it was
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_ptrain_inspect_shows_the_adapter(run):
    out, _, trainer = run
    params = list(trainer.model.parameters())
    trainable = sum(int(np.prod(p.shape)) for p in params if not p.stop_gradient)
    total = sum(int(np.prod(p.shape)) for p in params)
    line = (f"adapter: LoRA r=4 alpha=8 scaling=2 dropout=0.1 on 4 layers matching .*q_proj, .*v_proj; "
            f"trainable {trainable:,} of {total:,} parameters ({100 * trainable / total:.2f}%)")
    env = {**os.environ, "PYTHONPATH": REPO}
    for target in (out, out / "checkpoints" / "step-10"):  # a run, and one checkpoint
        shown = subprocess.run([sys.executable, "-m", "trainer.cli", "inspect", str(target)], env=env,
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert line in " ".join(shown.stdout.split()), shown.stdout
    frozen = [p for p in params if p.stop_gradient]
    base = (f"frozen base: not saved here ({len(frozen)} tensors, {sum(int(np.prod(p.shape)) for p in frozen):,} "
            "values; the resuming script loads it, checked against its recorded digest)")
    assert base in " ".join(shown.stdout.split()), shown.stdout  # the checkpoint's details (the loop's last)
    with open(os.path.join(REPO, "docs", "how-to", "lora.md"), encoding="utf-8") as f:
        page = " ".join(f.read().split())
    assert line in page and base in page  # the page shows what inspect prints for its model


def _page_commands(path: str) -> list:
    """tests/docs/doc_commands.py's reading of a page's shell commands (that folder is not on sys.path here)."""
    spec = importlib.util.spec_from_file_location("doc_commands", os.path.join(REPO, "tests", "docs", "doc_commands.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.page_commands(path)


def test_the_lora_page_runs_as_written(tmp_path, monkeypatch):
    """docs/how-to/lora.md: its example (the blocks marked ``runnable: paddleformers``), then its commands, in one
    scratch directory (tests/docs checks the other pages in the paddlenlp environment; it names this test)."""
    text = open(os.path.join(REPO, PAGE), encoding="utf-8").read()
    blocks = RUNNABLE.findall(text)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], os.path.join(REPO, PAGE), "exec"), {"__name__": "__main__"})
    assert sorted(os.listdir("runs/lora/checkpoints")) == ["latest", "run_id", "step-10", "step-12", "step-5"]
    assert os.path.isfile("runs/lora/adapter/lora_config.json") and os.path.isfile("runs/lora/inference/export.json")
    commands = [c.text for c in _page_commands(os.path.join(REPO, PAGE))]
    assert commands == ["ptrain inspect runs/lora"]
    shown = " ".join(text.split("```text\n", 1)[1].split("```", 1)[0].split())  # the output the page shows
    env = {**os.environ, "PYTHONPATH": REPO}
    for command in commands:  # ptrain is `python -m trainer.cli` (the project is not installed in this environment)
        done = subprocess.run([sys.executable, "-m", "trainer.cli", *command.split()[1:]], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert shown in " ".join(done.stdout.split()), done.stdout


# ---- two processes (data parallel over gloo): the same, through paddle's launcher ----------------------------------
def _worker(out: str, result: str, resume: str) -> None:
    """One rank of a 2-process LoRA run (this file run as a script under paddle.distributed.launch)."""
    trainer = train(out, max_steps=12, resume=resume or None)
    if trainer.is_main_process:
        logged = [[r["step"], r["loss"], r["learning_rate"]] for r in trainer.state.log_history if "loss" in r]
        np.savez(os.path.join(out, result + ".npz"), **state(trainer.model))
        with open(os.path.join(out, result + ".json"), "w", encoding="utf-8") as f:
            json.dump({"logged": logged, "world_size": trainer.world_size}, f)


def _launch(tmp_path, out, result, resume=""):
    from helpers import free_port, run_launch, worker_logs

    logs = tmp_path / f"logs-{result}"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--master",
           f"127.0.0.1:{free_port()}", "--log_dir", str(logs), os.path.abspath(__file__), str(out), result, resume]
    # run_launch: launched again only after a failure of paddle's own (its group rendezvous raced, or a rank died
    # of a signal with nothing in its log), as every launch of the main suite
    fresh = None if resume else (lambda: shutil.rmtree(out, ignore_errors=True))  # a first run starts from nothing
    done = run_launch(cmd, str(logs), {**os.environ, "PYTHONPATH": REPO}, timeout=600, cwd=str(tmp_path),
                      before_retry=fresh)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + worker_logs(str(logs))
    with open(out / f"{result}.json", encoding="utf-8") as f:
        return json.load(f), dict(np.load(out / f"{result}.npz"))


def test_two_processes_train_the_adapter_and_resume_bitwise(tmp_path):
    out = tmp_path / "run"
    full, full_params = _launch(tmp_path, out, "full")
    resumed, resumed_params = _launch(tmp_path, out, "resumed", str(out / "checkpoints" / "step-5"))
    assert full["world_size"] == resumed["world_size"] == 2
    assert [r[0] for r in full["logged"]] == list(range(1, 13))
    assert resumed["logged"] == full["logged"]
    base = state(lora_llama())
    for k, v in full_params.items():
        np.testing.assert_array_equal(resumed_params[k], v, err_msg=k)
        assert np.array_equal(v, base[k]) == ("lora_" not in k), k  # only the adapter trained


if __name__ == "__main__":  # a rank of test_two_processes_train_the_adapter_and_resume_bitwise
    _worker(*sys.argv[1:4])
