"""The objects alive when the training loop starts are frozen out of the full collections for the loop
(trainer.heap.frozen_heap), unfrozen after it, and a program's own gc.freeze() is left alone."""

import gc

import paddle
from helpers import ToyDataset, make_mlp

from callbacks import Callback
from trainer import Trainer, TrainingArguments


class FreezeCount(Callback):
    def __init__(self):
        self.counts = []

    def on_step_end(self, trainer):
        self.counts.append(gc.get_freeze_count())


def fit(tmp_path):
    seen = FreezeCount()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3, report_to=[],
                             save_strategy="no")
    Trainer(make_mlp(), args, train_dataset=ToyDataset(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[seen]).fit()
    return seen.counts


def test_the_loop_runs_with_the_heap_frozen_and_leaves_it_as_it_was(tmp_path):
    assert gc.get_freeze_count() == 0
    counts = fit(tmp_path / "a")
    assert len(counts) == 3 and min(counts) > 10_000  # paddle, the model, the data: frozen during the steps
    assert gc.get_freeze_count() == 0


def test_a_program_that_froze_its_own_objects_keeps_them_frozen(tmp_path):
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        counts = fit(tmp_path / "b")
        # not frozen again (that would add the objects made since: the model, the data, the loop's) and not
        # unfrozen; a frozen object can still be freed by its reference count, so the count only falls
        assert max(counts) <= mine and mine - 1_000 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()
