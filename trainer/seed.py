"""``set_seed``: one call that seeds Python's ``random``, numpy and paddle.

``fit()`` calls it with ``args.seed`` before it builds anything, so the data
order, dropout and DataLoader workers repeat run to run. The model's initial
weights are drawn when the model is built, which in the documented pattern is
before the ``Trainer`` exists: call ``set_seed`` first, as the README and
Hugging Face's ``set_seed`` do; the Trainer never re-initialises a model.

    >>> import paddle
    >>> set_seed(42); a = paddle.nn.Linear(2, 2).weight.numpy()
    >>> set_seed(42); b = paddle.nn.Linear(2, 2).weight.numpy()
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import random

import numpy as np
import paddle


def set_seed(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and paddle's generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)
