"""IterableDatasetState: a training stream's position travels in every checkpoint.

Joins the run when the training set is a ``paddle.io.IterableDataset`` with ``state_dict()`` and
``load_state_dict()`` (``Trainer.get_train_dataloader`` calls :meth:`IterableDatasetState.track`);
a stream without them is read again and its consumed batches skipped on resume
(``trainer.data.iterable``, which keeps the stream logic).

Events: ``on_save_begin`` (every rank: the per-rank states gathered to rank 0). State: one
``{"dataset": ..., "position": [pass, stream index]}`` per data rank, under the key ``IterableDataset``.
"""

from __future__ import annotations

import logging

import paddle

from trainer.data.iterable import IterableBatches

from .base import Callback

logger = logging.getLogger("trainer")


class IterableDatasetState(Callback):
    """Carries the stream's ``state_dict()`` of every rank in checkpoints (added by the trainer)."""

    order = 190

    def __init__(self, batches: IterableBatches):
        self.batches = batches
        self._states: list = []

    @classmethod
    def track(cls, trainer, batches: IterableBatches) -> None:
        """The one of ``trainer``'s callbacks that carries ``batches``' stream, when its dataset has state (a
        previous fit()'s is replaced); none when it has not."""
        trainer.callbacks.remove(cls)
        dataset = batches.dataset
        if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
            trainer.callbacks.add(cls(batches))

    @property
    def state_key(self) -> str:
        return "IterableDataset"

    def on_save_begin(self, trainer):  # every rank: gather the per-rank states to rank 0
        own = {"dataset": self.batches.dataset.state_dict(), "position": list(self.batches.position)}
        if trainer.world_size > 1:
            gathered: list = []
            paddle.distributed.all_gather_object(gathered, (self.batches.rank, own))
            # one state per data rank: the ranks of a tensor/pipeline-parallel group read the same stream
            self._states = [state for _, state in sorted(dict(gathered).items())]
        else:
            self._states = [own]

    def state_dict(self) -> dict:
        return {"per_rank": self._states}

    def load_state_dict(self, state: dict) -> None:
        states = state.get("per_rank") or []
        if len(states) != self.batches.world:
            logger.warning("the checkpoint holds IterableDataset state for %d processes, this run has %d: "
                           "skipping consumed batches instead", len(states), self.batches.world)
            return
        own = states[self.batches.rank]
        self.batches.dataset.load_state_dict(own["dataset"])
        self.batches.position = tuple(own["position"])
        self.batches.restored = True
