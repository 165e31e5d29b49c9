"""benchmarks/gpu_sharding.py (the sharding rows of gpu_check) without a GPU: the rows SKIP on one card and the
worker they launch trains for real (here on the CPU, one process)."""

import json

from benchmarks import gpu_sharding


def test_the_rows_skip_with_fewer_than_two_cards(tmp_path):
    for check in (gpu_sharding.check_sharding, gpu_sharding.check_offload_amp):
        result, detail = check(1, str(tmp_path))
        assert result == "SKIP" and "2+ cards" in detail


def test_the_worker_trains_and_writes_its_losses(tmp_path):
    gpu_sharding.worker(str(tmp_path), {"device": "cpu", "recompute": True})
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert len(losses) == gpu_sharding.STEPS and all(0 < x < 10 for x in losses)
