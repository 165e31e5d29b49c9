"""PaddleFormers' SFTTrainer on our Trainer (``trainer.sft``): a PaddleFormers 1.2 SFT script
(tests/paddleformers/scripts/sft_llama.py: chat data packed by ``create_dataset``, greedy intokens or bin
packing, a tiny random Llama, LoRA) run with its SFTTrainer and with ours, only the import changed, logs the
same loss, learning rate, ppl and eval_loss at every step, on 1 process and on 2; our SFTTrainer prepares
a ``datasets.Dataset`` as theirs does, token for token; and says in one line what it cannot take."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
REPO = os.path.dirname(os.path.dirname(HERE))
TOL = 1e-6
sys.path.insert(0, SCRIPTS)
from sft_data import chats, make_tokenizer, write_config  # noqa: E402


def _empty_but_logs(out):
    for entry in out.iterdir():
        if not entry.name.startswith("log"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def run_sft(which, out, *flags, nproc=1, script="sft_llama.py"):
    """The SFT script's RESULT (rank 0's) from a real run: one process, or paddle's launcher with two."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, SCRIPTS]))
    path = os.path.join(SCRIPTS, script)
    if nproc == 1:
        cmd = [sys.executable, path, which, str(out), *flags]
        proc = subprocess.run(cmd, env=env, cwd=SCRIPTS, capture_output=True, text=True, timeout=900)
    else:
        from helpers import run_launch

        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(out / "log"),
               "--nproc_per_node", str(nproc), path, which, str(out), *flags]
        # again only after a failure of paddle's own (helpers.run_launch), from an output folder emptied but for
        # the failed attempt's logs
        proc = run_launch(cmd, str(out / "log"), env, 900, cwd=SCRIPTS, before_retry=lambda: _empty_but_logs(out))
    text = proc.stdout + proc.stderr
    if nproc > 1 and (out / "log" / "workerlog.0").exists():
        text += (out / "log" / "workerlog.0").read_text(errors="replace")
    assert proc.returncode == 0, f"{which} {' '.join(flags)} failed ({proc.returncode}):\n{text[-4000:]}"
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{text[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def assert_same_numbers(theirs, ours):
    """Every log record: the same step, loss, learning rate and eval_loss within 1e-6, and ppl beside the loss
    (exp of it) in both."""
    a, b = theirs["records"], ours["records"]
    assert len(a) == len(b) and a, f"{len(a)} records of theirs, {len(b)} of ours"
    for x, y in zip(a, b):
        assert x["step"] == y["step"] and set(x) == set(y), (x, y)
        for key in ("loss", "learning_rate", "eval_loss"):
            if key in x:
                assert abs(x[key] - y[key]) <= TOL, f"step {x['step']}: {key} theirs {x[key]} ours {y[key]}"
        for key in ("ppl", "eval_ppl"):
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-5 * x[key], f"step {x['step']}: {key} {x[key]} vs {y[key]}"
    assert any("ppl" in x for x in a)


@pytest.mark.parametrize("flags", [("--eval",), ("--lora",), ("--packing", "binpacking")],
                         ids=["greedy-intokens+eval", "lora", "binpacking"])
def test_one_process_logs_their_numbers(tmp_path, flags):
    theirs = run_sft("theirs", tmp_path / "theirs", *flags)
    ours = run_sft("ours", tmp_path / "ours", *flags)
    assert_same_numbers(theirs, ours)
    if "--eval" in flags:
        assert sum("eval_loss" in r for r in ours["records"]) == 2


@pytest.mark.parametrize("flags", [("--eval",), ("--lora",)], ids=["greedy-intokens+eval", "lora"])
def test_two_processes_log_their_numbers(tmp_path, flags):
    """Their stream is dealt a batch at a time (IterableDatasetShard): so is ours under their arguments."""
    theirs = run_sft("theirs", tmp_path / "theirs", *flags, nproc=2)
    ours = run_sft("ours", tmp_path / "ours", *flags, nproc=2)
    assert_same_numbers(theirs, ours)


@pytest.mark.parametrize("n,block,world", [(10, 2, 2), (11, 3, 2), (7, 2, 3), (3, 4, 2)])
def test_a_stream_is_dealt_as_their_iterable_dataset_shard(n, block, world):
    """Under their arguments a stream goes to the ranks as their IterableDatasetShard deals it: a block of
    ``batch_size`` samples each in turn; in evaluation the last short group filled from the first group."""
    import itertools

    import paddle
    from paddleformers.trainer.trainer_utils import IterableDatasetShard

    from trainer.data.iterable import _padded_block_share, _rank_share

    class Stream(paddle.io.IterableDataset):
        def __init__(self, endless):
            self.endless = endless

        def __iter__(self):
            return itertools.count() if self.endless else iter(range(n))

    for rank in range(world):
        theirs = IterableDatasetShard(Stream(False), batch_size=block, num_processes=world, process_index=rank)
        assert list(_padded_block_share(Stream(False), rank, world, block)) == list(iter(theirs))
        theirs = IterableDatasetShard(Stream(True), batch_size=block, num_processes=world, process_index=rank)
        assert list(itertools.islice(_rank_share(Stream(True), rank, world, block=block), 3 * n)) == \
            list(itertools.islice(iter(theirs), 3 * n))


# ---- in process: the preparation, the evaluation step, the refusals ---------------------------------------
@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    from paddleformers.cli.train.sft.sft_config import SFTConfig
    from paddleformers.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("sft")
    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer(str(folder / "tokenizer")))
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         fuse_rms_norm=False)

    def args(**kw):
        return SFTConfig(output_dir=str(folder / "run"), amp_master_grad=False, sharding="", report_to=[],
                         disable_tqdm=True, save_strategy="no", max_steps=2, **kw)

    return dict(tokenizer=tokenizer, model=lambda: LlamaForCausalLM(config), args=args, chats=chats)


def _rows(dataset):
    return [{k: list(r[k]) for k in ("input_ids", "labels", "attention_mask")} for r in dataset]


@pytest.mark.parametrize("kind", ["text", "src-tgt"])
def test_a_datasets_dataset_is_prepared_as_theirs_prepares_it(pieces, kind):
    """A text column tokenized to max_seq_len; a src/tgt dataset formatted with the tokenizer's chat template
    first; labels shifted: the same rows as PaddleFormers' SFTTrainer. (A ``messages`` column is not found as
    a chat by theirs under datasets 4, whose features are no longer lists: theirs then asks for ``text``.)"""
    import datasets
    from paddleformers.cli.train.sft.sft_trainer import SFTTrainer as Theirs

    from trainer.sft import SFTTrainer

    chats = pieces["chats"](6, seed=3)
    if kind == "text":
        data = {"text": [" ".join(m["content"] for m in c["messages"]) for c in chats]}
    else:
        data = {"src": [c["messages"][0]["content"] for c in chats], "tgt": [c["messages"][1]["content"] for c in chats]}
    made = {}
    for name, cls in (("theirs", Theirs), ("ours", SFTTrainer)):
        trainer = cls(model=pieces["model"](), args=pieces["args"](max_seq_len=24),
                      train_dataset=datasets.Dataset.from_dict(data), eval_dataset={"a": datasets.Dataset.from_dict(data)},
                      tokenizer=pieces["tokenizer"])
        made[name] = (_rows(trainer.train_dataset), _rows(trainer.eval_dataset["a"]))
    assert made["ours"] == made["theirs"]
    assert max(len(r["input_ids"]) for r in made["ours"][0]) <= 24
    assert all(r["labels"][-1] == -100 for r in made["ours"][0])
    if kind == "src-tgt":  # the template's "u:" opens every row
        assert all(r["input_ids"][:2] == pieces["tokenizer"].convert_tokens_to_ids(["u", ":"]) for r in made["ours"][0])


def test_evaluation_returns_the_arg_max_of_the_logits_and_ppl(pieces):
    """Their prediction_step's arg-max (keepdim), not the logits; eval_ppl = exp(eval_loss) in what evaluate()
    returns and in the log record."""
    import datasets
    import numpy as np

    from trainer.sft import SFTTrainer

    text = {"text": [" ".join(m["content"] for m in c["messages"]) for c in pieces["chats"](5, seed=4)]}
    trainer = SFTTrainer(model=pieces["model"](), args=pieces["args"](max_seq_len=16, per_device_eval_batch_size=2),
                         eval_dataset=datasets.Dataset.from_dict(text), tokenizer=pieces["tokenizer"],
                         compute_metrics=lambda p: {"width": int(np.asarray(p.predictions).shape[-1])})
    metrics = trainer.evaluate()
    assert metrics["eval_width"] == 1  # [batch, seq, 1]: token ids, not [batch, seq, vocab] logits
    assert metrics["eval_ppl"] == pytest.approx(math.exp(metrics["eval_loss"]))
    assert trainer.state.log_history[-1]["eval_ppl"] == pytest.approx(metrics["eval_ppl"])


def test_do_generation_predicts_their_tokens(pieces):
    """With do_generation, evaluation generates (their model.generate call; top_k=1 here, so no chance in it):
    the same token rows as theirs from the same weights."""
    import types

    import datasets
    import numpy as np
    import paddle
    from paddleformers.cli.train.sft.sft_trainer import SFTTrainer as Theirs

    from trainer.sft import SFTTrainer

    text = {"text": [" ".join(m["content"] for m in c["messages"]) for c in pieces["chats"](4, seed=4)]}
    predictions = {}
    for name, cls in (("theirs", Theirs), ("ours", SFTTrainer)):
        paddle.seed(3)
        trainer = cls(model=pieces["model"](), args=pieces["args"](max_seq_len=16, per_device_eval_batch_size=2),
                      eval_dataset=datasets.Dataset.from_dict(text), tokenizer=pieces["tokenizer"],
                      do_generation=True, gen_args=types.SimpleNamespace(top_k=1, top_p=1.0),
                      data_args=types.SimpleNamespace(max_length=24), compute_metrics=lambda p: {})
        predictions[name] = np.asarray(trainer.predict(trainer.eval_dataset).predictions)
    assert predictions["ours"].shape == (4, 8)
    assert predictions["ours"].tolist() == predictions["theirs"].tolist()


def test_the_door_names_only_the_sft_options_without_an_effect(pieces, caplog):
    """max_seq_len and dataset_text_field have their effect here (the preparation); use_ssa has none: the
    door's one warning names it alone."""
    import logging

    from trainer.sft import SFTTrainer

    with caplog.at_level(logging.WARNING):
        SFTTrainer(model=pieces["model"](), args=pieces["args"](max_seq_len=24, dataset_text_field="body",
                                                                 use_ssa=True), tokenizer=pieces["tokenizer"])
    warned = [r.getMessage() for r in caplog.records if "no counterpart" in r.getMessage()]
    assert len(warned) == 1 and "use_ssa=True" in warned[0], warned
    assert "max_seq_len" not in warned[0] and "dataset_text_field" not in warned[0]


def test_what_it_cannot_take_is_one_line(pieces):
    from trainer.errors import ConfigError
    from trainer.sft import SFTTrainer

    with pytest.raises(ConfigError, match="needs a tokenizer"):
        SFTTrainer(model=pieces["model"](), args=pieces["args"]())
    with pytest.raises(ConfigError, match="gen_args and data_args"):
        SFTTrainer(model=pieces["model"](), args=pieces["args"](), tokenizer=pieces["tokenizer"], do_generation=True)
    trainer = SFTTrainer(model=pieces["model"](), args=pieces["args"](), tokenizer=pieces["tokenizer"])
    trainer.set_optimizer_grouped_parameters([p for p in trainer.model.parameters() if not p.stop_gradient])
    with pytest.raises(ConfigError, match="set_optimizer_grouped_parameters"):
        trainer.set_optimizer_grouped_parameters(trainer.model.parameters()[:1])
    with pytest.raises(ConfigError, match="post-training quantization"):
        trainer.get_ptq_dataloader(None)


def test_a_model_name_and_our_own_arguments(pieces, cli_inputs, tmp_path):
    """A model name loads the model and its tokenizer (theirs: AutoModelForCausalLM, AutoTokenizer); our own
    TrainingArguments take SFTConfig's defaults for the SFT options (max_seq_len 2048) and train."""
    import datasets

    from trainer import TrainingArguments
    from trainer.sft import SFTTrainer

    text = {"text": [" ".join(m["content"] for m in c["messages"]) for c in pieces["chats"](8, seed=5)]}
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=2,
                             logging_steps=1, report_to="none", device="cpu")
    trainer = SFTTrainer(model=str(cli_inputs / "model"), args=args, train_dataset=datasets.Dataset.from_dict(text))
    assert trainer.tokenizer.pad_token_id == 0 and trainer.args is args
    trainer.train()
    records = [r for r in trainer.state.log_history if "loss" in r]
    assert len(records) == 2 and all(r["ppl"] == pytest.approx(math.exp(r["loss"])) for r in records)


# ---- paddleformers-cli train CONFIG.yaml: their run_sft with our SFTTrainer (python -m trainer.sft train) -----
THEIR_LOSS = re.compile(r"- loss: ([0-9.e+-]+), learning_rate: ([0-9.e+-]+), global_step: (\d+)")


@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    subprocess.run([sys.executable, os.path.join(SCRIPTS, "sft_data.py"), str(folder)], check=True,
                   env=dict(os.environ, PYTHONPATH=SCRIPTS), capture_output=True, timeout=300)
    return folder


def _cli(cmd, cwd, log_dir=None):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(cmd, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    if log_dir is not None and (log_dir / "workerlog.0").exists():
        text += (log_dir / "workerlog.0").read_text(errors="replace")
    return proc.returncode, text


def _launch(nproc, script, log_dir):
    if nproc == 1:
        return [sys.executable, script]
    return [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(log_dir), "--nproc_per_node",
            str(nproc), script]


def _their_records(text):
    """Their log lines (once each: their logger writes to stdout and stderr), by step."""
    records = {}
    for loss, lr, step in THEIR_LOSS.findall(text):
        records.setdefault(int(step), {"step": int(step), "loss": float(loss), "learning_rate": float(lr)})
    return [records[k] for k in sorted(records)]


def _our_records(records):
    return [{"step": r["step"], "loss": r["loss"], "learning_rate": r["learning_rate"]} for r in records if "loss" in r]


@pytest.mark.parametrize("nproc", [1, 2])
def test_their_cli_config_runs_their_run_sft_on_our_trainer(tmp_path, cli_inputs, nproc):
    """The same YAML: ``paddleformers-cli train``'s launch of their launcher.py, and ``python -m trainer.sft
    train`` (on 2 processes: paddle's launcher on trainer/sft/workflow.py) log the same loss and learning rate
    at every step. On 2 CPU processes their run loads and saves the model only on a GPU (flex checkpoints call
    ``.cuda()``): there the model is built from its config (continue_training: false) and the run is their
    benchmark mode (autotuner_benchmark: nothing saved); ours logs its records to metrics.jsonl."""
    from paddleformers.cli import launcher

    two = nproc == 2
    extra = "autotuner_benchmark: true\n" if two else ""
    runs = {}
    for which, script in (("theirs", launcher.__file__), ("ours", os.path.join(REPO, "trainer", "sft", "workflow.py"))):
        out, logs = tmp_path / f"out_{which}", tmp_path / f"log_{which}"
        config = write_config(str(tmp_path / f"{which}.yaml"), str(cli_inputs), str(out), continue_training=not two,
                              report_to="jsonl" if two and which == "ours" else "none", extra=extra)
        if which == "ours" and not two:
            cmd = [sys.executable, "-m", "trainer.sft", "train", config]
        else:
            cmd = _launch(nproc, script, logs) + ["train", config]
        code, text = _cli(cmd, tmp_path, logs if two else None)
        assert code == 0, f"{which} failed ({code}):\n{text[-4000:]}"
        runs[which] = (out, text)
    theirs = _their_records(runs["theirs"][1])
    out = runs["ours"][0]
    if two:
        ours = _our_records(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    else:
        ours = _our_records(json.loads((out / "trainer_state.json").read_text())["log_history"])
    assert len(theirs) == len(ours) >= 5, (theirs, ours)
    for x, y in zip(theirs, ours):
        assert x["step"] == y["step"]
        assert abs(x["loss"] - y["loss"]) <= TOL and abs(x["learning_rate"] - y["learning_rate"]) <= TOL, (x, y)
    if not two:  # both saved the LoRA adapter as PaddleFormers reads it
        for folder in (runs["theirs"][0], out):
            assert (folder / "lora_config.json").exists() and list(folder.glob("peft_model*.safetensors")), \
                sorted(p.name for p in folder.iterdir())


def test_a_stage_this_trainer_does_not_run_is_one_line(tmp_path, cli_inputs):
    config = tmp_path / "dpo.yaml"
    write_config(str(config), str(cli_inputs), str(tmp_path / "out"))
    config.write_text(config.read_text().replace("stage: SFT", "stage: DPO"))
    config = str(config)
    code, out = _cli([sys.executable, "-m", "trainer.sft", "train", config], tmp_path)
    assert code == 2, out[-2000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == ["error: stage: 'DPO' is not run on this trainer (only SFT, PT): run it with paddleformers-cli"]
    assert not (tmp_path / "out").exists()
