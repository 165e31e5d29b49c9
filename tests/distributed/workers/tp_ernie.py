"""Worker of the tensor-parallel tests: train the ERNIE-style encoder (models/ernie/parallel_model.py) with
random weights under a layout, and dump the logged losses per rank.

usage: tp_ernie.py OUT_DIR JSON_OPTIONS
options: mp (tensor_parallel_degree), steps, save_steps (0: no checkpoints), resume (a checkpoint directory),
export (bool: export at the end, every rank calls it), dropout, global_batch, device (default cpu), shim (default:
tensor parallel on CPU; benchmarks/gpu_tensor_parallel.py runs it on cards without), lr, clip, optim, recompute,
tensor_parallel_config, nan_grad_at_step (the last rank's block of one split weight gets a NaN gradient in that step; NaNGuard() skips).

Every layout starts from the same whole weights (numpy, seed 0), each rank taking its blocks of the split
parameters the way a resume does (trainer.layout.slices.local_blocks), so the runs can be compared.
Tensor parallel installs the test-only shim (tests/parallel/cpu_hybrid_shim.py) first.
"""

import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(TESTS))  # the repository first: trainer is the package, not tests/trainer
sys.path.append(TESTS)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from callbacks import Callback, NaNGuard  # noqa: E402
from models.ernie.batching import collate  # noqa: E402
from models.ernie.parallel_model import ErnieTPConfig, ErnieTPForSequenceClassification  # noqa: E402
from trainer import Trainer, TrainingArguments  # noqa: E402
from trainer import distributed as dist  # noqa: E402
from trainer.layout.slices import local_blocks, tensor_parallel_splits  # noqa: E402

SHAPE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32, num_labels=3)


class Tokens(paddle.io.Dataset):
    def __init__(self, n=64, length=12, seed=5):
        rng = np.random.RandomState(seed)
        self.ids = rng.randint(1, SHAPE["vocab_size"], size=(n, length)).astype("int64")
        for row, cut in enumerate(rng.randint(length // 2, length + 1, size=n)):
            self.ids[row, cut:] = 0  # padding, masked in attention
        self.labels = (self.ids[:, 1] % SHAPE["num_labels"]).astype("int64")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.ids[i], int(self.labels[i])


class NanGradient(Callback):
    """In one step, a NaN in the last rank's block of the first feed-forward weight's gradient."""

    def __init__(self, step):
        self.step = step

    def on_backward_end(self, trainer):
        if trainer.rank == trainer.world_size - 1 and trainer.state.global_step + 1 == self.step:
            grad = trainer.model.layers[0].ffn_in.weight.grad
            paddle.assign(paddle.full_like(grad, float("nan")), output=grad)


def whole_weights(model) -> dict:
    """Every parameter's whole value, from one seed, whatever the layout."""
    rng = np.random.RandomState(0)
    out = {}
    for name, p in sorted(model.single_card_model().state_dict().items()):
        scale = 0.0 if name.endswith("bias") else (1.0 if "norm" in name else 0.2)
        out[name] = (np.ones(p.shape) if "norm" in name and name.endswith("weight") else
                     rng.standard_normal(p.shape) * scale).astype("float32")
    return out


def main(out_dir, opts):
    mp = opts.get("mp", 1)
    if opts.get("shim", mp > 1 and opts.get("device", "cpu") == "cpu"):
        import parallel.cpu_hybrid_shim as shim  # test-only: paddle's GPU-only paths of tensor parallel

        shim.install()
    readers = dist.get_world_size() // mp
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=opts.get("global_batch", 8) // readers,
                             max_steps=opts.get("steps", 4), learning_rate=opts.get("lr", 1e-3), warmup_steps=1,
                             lr_scheduler_type="linear", logging_steps=1, max_grad_norm=opts.get("clip", 1.0),
                             report_to=[], save_strategy="steps" if opts.get("save_steps") else "no",
                             save_steps=opts.get("save_steps") or 0, evaluation_strategy="no", device=opts.get("device", "cpu"),
                             tensor_parallel_degree=mp, seed=11, recompute=opts.get("recompute", False),
                             optim=opts.get("optim", "adamw"),
                             tensor_parallel_config=opts.get("tensor_parallel_config", ""))  # fleet's topology is up from here (mp > 1)
    drop = opts.get("dropout", 0.0)
    model = ErnieTPForSequenceClassification(ErnieTPConfig(**SHAPE, hidden_dropout_prob=drop,
                                                           attention_probs_dropout_prob=drop, tensor_parallel_degree=mp))
    weights = whole_weights(model)
    if mp > 1:
        from paddle.distributed import fleet

        local_blocks(tensor_parallel_splits(model), fleet.get_hybrid_communicate_group().get_model_parallel_rank(),
                     mp, weights, {})
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
    callbacks = [NaNGuard(), NanGradient(opts["nan_grad_at_step"])] if opts.get("nan_grad_at_step") else []
    trainer = Trainer(model, args, train_dataset=Tokens(), eval_dataset=Tokens(n=24, seed=9), collate_fn=collate,
                      callbacks=callbacks)
    state = trainer.fit(resume_from_checkpoint=opts.get("resume"))
    metrics = trainer.evaluate()
    result = {"layout": trainer.layout.describe(), "global_step": state.global_step, "eval_loss": metrics["eval_loss"],
              "skipped_steps": state.skipped_steps,
              "losses": {str(r["step"]): r["loss"] for r in state.log_history if "loss" in r},
              "model": type(trainer.model_wrapped).__name__, "optimizer": type(trainer.optimizer).__name__}
    if opts.get("export"):
        result["export"] = trainer.export(os.path.join(out_dir, "inference"))
    with open(os.path.join(out_dir, f"result-rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
    # as ptrain's own ranks end (trainer/cli/launch_entry.py): once every file is closed, skip paddle's C++
    # teardown, which aborted a rank (-6) after its results were written in one full run under load
    from trainer.process import exit_now

    exit_now(0)
