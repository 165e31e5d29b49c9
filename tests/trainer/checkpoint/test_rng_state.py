"""RNG state per rank: the CPU generator and this rank's CUDA generator by name; mismatches are named."""

import logging

import numpy as np
import paddle
from paddle.base import core

from trainer.checkpoint import rng as checkpoint_io


def _gens(cuda_id=None):
    """Stand-ins with paddle's real Generator class: a CPU generator and, optionally, 'this rank's card'."""
    return {"cpu": core.Generator(), "cuda": None if cuda_id is None else (cuda_id, core.Generator())}


def _draws(gens):
    return [gens["cpu"].random()] + ([gens["cuda"][1].random()] if gens["cuda"] else [])


def test_layout_on_cpu_and_exact_restore():
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    tracker = get_rng_state_tracker()  # process-wide: a PaddleNLP set_seed earlier in this process fills it
    kept = dict(tracker.states_), set(tracker.seeds_)
    tracker.reset()
    try:
        state = checkpoint_io.rng_state()
        assert set(state) == {"python", "numpy", "paddle_cpu", "paddle_cuda", "mp_tracker"}
        assert state["paddle_cuda"] is None and state["mp_tracker"] is None  # no tensor parallel here
        expected = paddle.rand([4]).numpy()
        assert checkpoint_io.set_rng_state(state) == []
        np.testing.assert_array_equal(paddle.rand([4]).numpy(), expected)
    finally:
        tracker.states_, tracker.seeds_ = kept


def test_this_ranks_cuda_generator_is_saved_by_name_and_restored(caplog):
    gens = _gens(cuda_id=3)
    state = checkpoint_io.rng_state(gens)
    assert state["paddle_cuda"]["device"] == "gpu:3"
    expected = _draws(gens)
    assert checkpoint_io.set_rng_state(state, gens) == []
    assert _draws(gens) == expected
    other_card = _gens(cuda_id=0)  # another CUDA_VISIBLE_DEVICES: the rank's own card is gpu:0 now
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        assert checkpoint_io.set_rng_state(state, other_card) == []
    assert _draws(other_card) == expected and not caplog.records


def test_mismatches_are_named_in_a_warning(caplog):
    gpu_gens = _gens(cuda_id=2)
    on_gpu = checkpoint_io.rng_state(gpu_gens)
    next_cpu_draw = gpu_gens["cpu"].random()
    on_cpu = checkpoint_io.rng_state(_gens())
    cpu_gens = _gens()
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        missed = checkpoint_io.set_rng_state(on_gpu, cpu_gens)
    assert missed == ["the CUDA generator saved on gpu:2 (this run is on CPU)"]
    assert "resumes without restoring the CUDA generator saved on gpu:2" in caplog.text
    assert cpu_gens["cpu"].random() == next_cpu_draw  # what can be restored still is
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        missed = checkpoint_io.set_rng_state(on_cpu, _gens(cuda_id=1))
    assert missed == ["the CUDA generator of gpu:1 (the checkpoint was written on CPU)"]
    assert "gpu:1" in caplog.text


def test_older_checkpoints_still_load(caplog):
    gens = _gens()
    old = {k: v for k, v in checkpoint_io.rng_state(gens).items() if k not in ("paddle_cpu", "paddle_cuda")}
    old["paddle"] = [checkpoint_io._generator_to_json(gens["cpu"])]  # paddle.get_rng_state() on a CPU place
    expected = _draws(gens)
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        assert checkpoint_io.set_rng_state(old, gens) == []
        assert _draws(gens) == expected
        eight_cards = dict(old, paddle=old["paddle"] * 8)  # written on a GPU place with 8 visible cards
        (missed,) = checkpoint_io.set_rng_state(eight_cards, gens)
    assert "8 saved by an older checkpoint" in missed and "this run on cpu" in missed
    assert "resumes without restoring paddle's generators" in caplog.text


def test_the_model_parallel_tracker_states_are_saved_and_restored():
    """fleet's model-parallel RNG tracker (what tensor-parallel dropout draws from) goes into the state and back."""
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    tracker = get_rng_state_tracker()
    tracker.reset()
    try:
        tracker.add("model_parallel_rng", 1234)
        state = checkpoint_io.rng_state()
        assert list(state["mp_tracker"]) == ["model_parallel_rng"]
        with tracker.rng_state():
            expected = paddle.rand([4]).numpy()
        assert checkpoint_io.set_rng_state(state) == []
        with tracker.rng_state():
            np.testing.assert_array_equal(paddle.rand([4]).numpy(), expected)
        tracker.reset()
        assert any("model-parallel RNG state" in m for m in checkpoint_io.set_rng_state(state))  # named, not skipped
    finally:
        tracker.reset()
