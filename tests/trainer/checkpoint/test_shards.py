"""The sharded checkpoint format (trainer.checkpoint.shards) and its writer (trainer.checkpoint.sharded), in one
process: who writes which tensor, putting tensors back together from flat ranges (sharding stage 3) and blocks
(tensor / pipeline parallel), refusing parts that do not cover a tensor exactly once, and the writer's agreement:
latest moves only when every rank's shard is in, and a rank that fails or never reports is named.
The 2-process runs are in tests/distributed/test_sharded_checkpoint*.py."""

import os
import threading

import numpy as np
import pytest

from trainer import TrainingError
from trainer.checkpoint import sharded
from trainer.checkpoint.manifest import read_manifest, verify
from trainer.checkpoint.shards import assemble, plan, shard_file

F32 = "float32"


def test_a_replicated_tensor_is_written_once_and_the_writes_are_spread():
    held = [{f"model/w{i}": ([10, 10], F32) for i in range(4)} for _ in range(2)]
    index = plan(held, [{}, {}])
    writers = [index[f"model/w{i}"]["parts"][0]["rank"] for i in range(4)]
    assert all(len(index[k]["parts"]) == 1 for k in index)
    assert sorted(writers) == [0, 0, 1, 1]


def test_an_owned_state_is_written_by_its_owner_and_ranks_even_out_around_it():
    held = [{"model/a": ([100], F32), "model/b": ([100], F32), "optimizer/param:a_moment1_0": ([300], F32)},
            {"model/a": ([100], F32), "model/b": ([100], F32)}]
    index = plan(held, [{}, {}])
    assert index["optimizer/param:a_moment1_0"]["parts"][0]["rank"] == 0
    assert {index["model/a"]["parts"][0]["rank"], index["model/b"]["parts"][0]["rank"]} == {1}


def test_ranks_holding_different_shapes_without_slices_are_refused():
    with pytest.raises(ValueError, match="model/w with different shapes"):
        plan([{"model/w": ([4], F32)}, {"model/w": ([2], F32)}], [{}, {}])


def test_the_same_slice_on_two_data_parallel_replicas_is_written_once():
    spec = [{"model/w": {"shape": [4], "flat": [0, 2]}}, {"model/w": {"shape": [4], "flat": [2, 4]}}]
    held = [{"model/w": ([2], F32)}] * 4
    index = plan(held, spec + spec)  # ranks 2 and 3 replicate ranks 0 and 1
    assert [(p["rank"], p["flat"]) for p in index["model/w"]["parts"]] == [(0, [0, 2]), (1, [2, 4])]


def _files(parts):
    return lambda name: parts[name]


def test_flat_ranges_rebuild_the_tensor():
    full = np.arange(12, dtype=np.float32).reshape(3, 4)
    index = {"model/w": {"shape": [3, 4], "dtype": F32, "parts": [
        {"rank": 0, "file": "a", "key": "model/w", "flat": [0, 7]}, {"rank": 1, "file": "b", "key": "model/w", "flat": [7, 12]}]}}
    model, opt = assemble(index, _files({"a": {"model/w": full.reshape(-1)[:7]}, "b": {"model/w": full.reshape(-1)[7:]}}))
    assert np.array_equal(model["w"], full) and opt == {}


def test_blocks_rebuild_the_tensor():  # tensor parallel: columns split over 2 ranks
    full = np.arange(12, dtype=np.float32).reshape(3, 4)
    index = {"optimizer/param:w_moment1_0": {"shape": [3, 4], "dtype": F32, "parts": [
        {"rank": 0, "file": "a", "key": "k", "offsets": [0, 0]}, {"rank": 1, "file": "b", "key": "k", "offsets": [0, 2]}]}}
    _, opt = assemble(index, _files({"a": {"k": full[:, :2].copy()}, "b": {"k": full[:, 2:].copy()}}))
    assert np.array_equal(opt["param:w_moment1_0"], full)


def test_only_the_files_holding_the_wanted_tensors_are_read():
    index = {"model/a": {"shape": [1], "dtype": F32, "parts": [{"rank": 0, "file": "a", "key": "model/a"}]},
             "model/b": {"shape": [1], "dtype": F32, "parts": [{"rank": 1, "file": "b", "key": "model/b"}]}}
    read = []

    def load(name):
        read.append(name)
        return {"model/" + name: np.zeros(1, np.float32)}

    model, _ = assemble(index, load, keys=["model/b"])
    assert read == ["b"] and list(model) == ["b"]


@pytest.mark.parametrize("ranges,message", [
    ([[0, 5], [6, 12]], "cover 1 of its 12 values no time"),
    ([[0, 7], [6, 12]], "and 1 more than once"),
])
def test_parts_that_leave_a_gap_or_overlap_are_refused(ranges, message):
    index = {"model/w": {"shape": [12], "dtype": F32, "parts": [
        {"rank": r, "file": f"f{r}", "key": "w", "flat": rng} for r, rng in enumerate(ranges)]}}
    files = {f"f{r}": {"w": np.zeros(b - a, np.float32)} for r, (a, b) in enumerate(ranges)}
    with pytest.raises(ValueError, match=message):
        assemble(index, _files(files))


def test_a_part_missing_from_its_file_names_the_file_and_the_rank():
    index = {"model/w": {"shape": [2], "dtype": F32, "parts": [{"rank": 1, "file": "shard-1", "key": "model/w"}]}}
    with pytest.raises(ValueError, match=r"shard-1 \(rank 1\) lacks tensor model/w"):
        assemble(index, _files({"shard-1": {}}))


# ---- the writer: two ranks as two threads of one process (the files and the agreement are real) ---------------
def _snaps(world=2, token=1):
    held = [{"model/w": ([4], F32), f"optimizer/param:w_moment{r}_0": ([4], F32)} for r in range(world)]
    index = plan(held, [{}] * world)
    snaps = []
    for rank in range(world):
        tensors = {k: np.full(4, rank, np.float32) for k, e in index.items() if e["parts"][0]["rank"] == rank}
        snap = {"shard": {"rank": rank, "world_size": world, "file": shard_file(rank, world), "writer_pid": os.getpid(),
                          "token": token}, "tensors": tensors, "step": 3, "run_id": "r"}
        if rank == 0:
            snap.update(meta={"layout": {"world_size": world, "sharded": True}, "optimizer_scalars": {},
                              "lr_scheduler": None, "state": {"global_step": 3}, "callbacks": {}, "rng_per_rank": [],
                              "args": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1},
                              "world_size": world}, index=index)
        snaps.append(snap)
    return snaps


def _write_all(snaps, final, root):
    errors = {}

    def run(snap):
        try:
            sharded.write(snap, final, root)
        except Exception as exc:  # noqa: BLE001 - collected for the test
            errors[snap["shard"]["rank"]] = exc

    threads = [threading.Thread(target=run, args=(s,)) for s in snaps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_every_shard_is_in_before_latest_moves(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    final = str(root / "step-3")
    assert _write_all(_snaps(), final, str(root)) == {}
    manifest = verify(final)
    assert manifest["format_version"] == 2
    assert {n: m.get("rank") for n, m in manifest["files"].items()} == {
        "shard-00000-of-00002.safetensors": 0, "shard-00001-of-00002.safetensors": 1, "trainer.json": None}
    assert (root / "latest").read_text().strip() == "step-3"
    assert not [n for n in os.listdir(final) if n.startswith(".")] and sorted(os.listdir(root)) == ["latest", "run_id", "step-3"]
    assert read_manifest(final)["tensors"]["model/w"]["parts"][0]["rank"] in (0, 1)


def test_a_rank_that_cannot_write_is_named_and_nothing_moves(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "latest").write_text("step-1\n")
    final = str(root / "step-3")
    tmp = sharded.temporary_dir(final, os.getpid())
    os.makedirs(os.path.join(tmp, shard_file(1, 2)))  # a directory where rank 1's shard file must go
    errors = _write_all(_snaps(), final, str(root))
    assert isinstance(errors.get(0), TrainingError)
    assert "rank 1 could not write its shard" in str(errors[0]) and "\n" not in str(errors[0])
    assert 1 in errors  # rank 1's own error, as its writer raises it
    assert not os.path.exists(final) and not os.path.exists(tmp)
    assert (root / "latest").read_text().strip() == "step-1"


def test_a_rank_that_never_reports_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sharded, "WAIT_S", 0.5)
    root = tmp_path / "checkpoints"
    root.mkdir()
    final = str(root / "step-3")
    errors = _write_all(_snaps()[:1], final, str(root))  # rank 1 never writes
    assert "rank(s) [1] did not report their shard" in str(errors[0])
    assert not os.path.exists(final) and not os.path.exists(root / "latest")


def test_a_record_of_an_earlier_save_is_not_taken_for_this_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sharded, "WAIT_S", 0.5)
    root = tmp_path / "checkpoints"
    root.mkdir()
    final = str(root / "step-3")
    assert _write_all(_snaps(token=1)[1:], final, str(root)) == {}  # rank 1 of an earlier save (token 1) left a record
    errors = _write_all(_snaps(token=2)[:1], final, str(root))
    assert "rank(s) [1] did not report" in str(errors[0])
