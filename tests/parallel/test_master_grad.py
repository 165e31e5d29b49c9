"""amp_master_grad acts: paddle's mix_precision_utils keep float32 gradients (param.main_grad) and the optimizer
steps and clips from them. On CPU paddle keeps the weights in float32 (AMP is a no-op there), so the run must
equal the plain one up to the order of the clip's sums; the low-precision weights are a GPU row
(benchmarks/gpu_check.py)."""

import os
import sys

import numpy as np
import paddle

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed", "workers"))
from parallel_toy import Blocks, Data  # noqa: E402

from trainer import Trainer, TrainingArguments  # noqa: E402


def _train(tmp_path, **kwargs):
    paddle.seed(1)
    model = Blocks()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=4,
                             learning_rate=1e-3, max_grad_norm=0.05, report_to=[], save_strategy="no",
                             evaluation_strategy="no", device="cpu", **kwargs)
    trainer = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss())
    trainer.fit()
    return trainer, {k: v.numpy() for k, v in model.state_dict().items()}


def test_master_gradients_train_like_the_plain_run(tmp_path):
    _, plain = _train(tmp_path)
    trainer, master = _train(tmp_path, amp="bf16", amp_level="O2", amp_master_grad=True)
    assert type(trainer.optimizer).__name__ == "MixPrecisionOptimizer"
    assert trainer.layout.master_grad and trainer.layout.clips_in_optimizer
    assert all(p.main_grad is not None and p.main_grad.dtype == paddle.float32 for p in trainer.model.parameters())
    assert trainer.state.grad_norm is None  # paddle clipped inside the step, from main_grad
    for name in plain:
        np.testing.assert_allclose(master[name], plain[name], rtol=0, atol=1e-6, err_msg=name)
