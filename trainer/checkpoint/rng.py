"""RNG states of a process (Python, numpy, paddle CPU and this rank's CUDA generator, and the states of fleet's
model-parallel RNG tracker when tensor parallel registered them) as JSON values."""

from __future__ import annotations

import logging
import random
from typing import List, Optional

import numpy as np
import paddle

from .. import distributed as dist

logger = logging.getLogger("trainer.checkpoint")


# paddle.get_rng_state() returns the generators of the current place's kind: on a GPU place the
# CUDA generators of every visible card and not the CPU one (which CPU-side ops and DataLoader
# seeding use), and their number depends on CUDA_VISIBLE_DEVICES. So each rank saves its CPU
# generator and its own card's CUDA generator by name; a generator the checkpoint lacks, or
# this run lacks, is named in a warning instead of being skipped silently.
def rng_generators() -> dict:
    """This process's paddle generators: ``{"cpu": Generator, "cuda": (device id, Generator) or None}``."""
    from paddle.base import core

    device = paddle.get_device()
    cuda = None
    if device.startswith("gpu"):
        device_id = int(device.partition(":")[2] or 0)
        cuda = (device_id, core.default_cuda_generator(device_id))
    return {"cpu": core.default_cpu_generator(), "cuda": cuda}


def rng_state(generators: Optional[dict] = None) -> dict:
    """Python, numpy and paddle RNG states of this process, as JSON values."""
    gens = generators or rng_generators()
    py = random.getstate()
    np_state = np.random.get_state()
    cuda = gens["cuda"]
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "paddle_cpu": _generator_to_json(gens["cpu"]),
        "paddle_cuda": None if cuda is None else {"device": f"gpu:{cuda[0]}", "state": _generator_to_json(cuda[1])},
        "mp_tracker": _tracker_to_json(),
    }


def _tracker():
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    return get_rng_state_tracker()


def _tracker_to_json() -> Optional[dict]:
    """fleet's model-parallel RNG tracker (``get_rng_state_tracker``): the generator states it keeps by name (the
    dropout of tensor-parallel ranks draws from ``model_parallel_rng``, seeded per rank); None when it has none."""
    states = _tracker().get_states_tracker()
    if not states:
        return None
    return {name: [[list(x) if isinstance(x, (list, tuple)) else x for x in s.__getstate__()] for s in gens]
            for name, gens in states.items()}


def _tracker_from_json(saved: dict, missed: List[str]) -> None:
    tracker = _tracker()
    own = tracker.get_states_tracker()
    states = {}
    for name, gens in saved.items():
        if name not in own or len(own[name]) != len(gens):
            missed.append(f"the model-parallel RNG state {name!r} (this run's tracker has no such state)")
            continue
        template = own[name][0]
        restored = []
        for values in gens:
            state = type(template).__new__(type(template))
            state.__setstate__(tuple(values))
            restored.append(state)
        states[name] = restored
    if states:
        tracker.set_states_tracker(states)


def _generator_to_json(generator) -> list:
    return [list(x) if isinstance(x, (list, tuple)) else x for x in generator.get_state().__getstate__()]


def _generator_from_json(generator, saved: list) -> None:
    template = generator.get_state()
    state = type(template).__new__(type(template))
    state.__setstate__(tuple(saved))
    generator.set_state(state)


def set_rng_state(state: dict, generators: Optional[dict] = None) -> List[str]:
    """Restore what ``rng_state`` saved; return (and log as a warning) what could not be restored.

    Also reads the layout of earlier checkpoints (``"paddle"``: the list
    ``paddle.get_rng_state()`` gave), restoring it where it fits this place.
    """
    gens = generators or rng_generators()
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    cuda = gens["cuda"]
    here = f"gpu:{cuda[0]}" if cuda is not None else "cpu"
    missed: List[str] = []
    if "paddle_cpu" in state:
        _generator_from_json(gens["cpu"], state["paddle_cpu"])
        saved_cuda = state.get("paddle_cuda")
        if saved_cuda is not None and cuda is not None:
            _generator_from_json(cuda[1], saved_cuda["state"])  # this rank's card, whatever its number
        elif saved_cuda is not None:
            missed.append(f"the CUDA generator saved on {saved_cuda['device']} (this run is on CPU)")
        elif cuda is not None:
            missed.append(f"the CUDA generator of {here} (the checkpoint was written on CPU)")
    else:  # format of earlier versions: the generators of the place it was saved on
        saved = state.get("paddle") or []
        if cuda is None and len(saved) == 1:
            _generator_from_json(gens["cpu"], saved[0])
        elif cuda is not None and len(saved) == paddle.device.cuda.device_count():
            _generator_from_json(cuda[1], saved[cuda[0]])
            missed.append("the CPU generator (an older checkpoint written on GPU does not hold it)")
        else:
            missed.append(f"paddle's generators ({len(saved)} saved by an older checkpoint, which do not match "
                          f"this run on {here})")
    if state.get("mp_tracker"):
        _tracker_from_json(state["mp_tracker"], missed)
    if missed:
        logger.warning("rank %d resumes without restoring %s: random draws on that generator (dropout, random "
                       "augmentation on the device) differ from an uninterrupted run", dist.get_rank(),
                       "; ".join(missed))
    return missed
