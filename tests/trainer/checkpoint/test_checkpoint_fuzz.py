"""Damaged and hostile checkpoints are refused with DataError, and nothing in them ever runs.

A real checkpoint of a tiny run is the template. Each case copies it, damages
one file (truncation, a flipped bit, random bytes, random JSON, deletion), with
the manifest left as written (the damage must be caught by the checksums) or
re-signed to match (a hostile checkpoint: the parsers themselves must refuse
it), and resumes a fresh Trainer from it. The only acceptable outcomes are a
``trainer.errors.DataError`` or, for damage that leaves a well-formed file
(a bit flipped inside tensor data and re-signed), a normal load.

The pickle test plants files named like paddle's ``model.pdparams`` /
``optimizer.pdopt`` whose unpickling would create a marker file, points
``trainer.json`` at them, re-signs the manifest, and shows that loading never
creates the marker.
"""

import hashlib
import json
import os
import pickle
import re
import shutil

import paddle
import pytest
from helpers import REPO, ToyDataset, make_mlp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer import Trainer, TrainingArguments
from trainer.checkpoint.manifest import verify
from trainer.errors import ConfigError, DataError

STEP = 3
FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _trainer(out, max_steps=STEP):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, max_steps=max_steps,
                             learning_rate=0.01, save_strategy="steps", save_steps=STEP, save_async=False,
                             report_to=[], evaluation_strategy="no")
    return Trainer(make_mlp(), args, train_dataset=ToyDataset(40), loss_fn=paddle.nn.CrossEntropyLoss())


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    out = tmp_path_factory.mktemp("template")
    _trainer(out).fit()
    path = out / "checkpoints" / f"step-{STEP}"
    verify(str(path))
    return out


@pytest.fixture
def fresh(tmp_path, template):
    """A copy of the template run; returns (run dir, checkpoint dir)."""
    counter = {"n": 0}

    def make():
        counter["n"] += 1
        run = tmp_path / f"run{counter['n']}"
        shutil.copytree(template, run)
        return run, run / "checkpoints" / f"step-{STEP}"

    return make


def _resume(run, path):
    """Resume a fresh Trainer from ``path`` (no further steps): returns the trainer."""
    trainer = _trainer(run)
    trainer.fit(resume_from_checkpoint=str(path))
    return trainer


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _resign(ckpt):
    """Rewrite the manifest so every file in the directory verifies, and its digest (what an attacker would do)."""
    manifest_path = ckpt / "manifest.json"
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["files"] = {name: {"bytes": os.path.getsize(ckpt / name), "sha256": _sha(ckpt / name)}
                         for name in sorted(os.listdir(ckpt)) if name not in ("manifest.json", "manifest.sha256")}
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    _reseal(ckpt)


def _reseal(ckpt):
    """Write the manifest's digest anew for the manifest as it now is."""
    (ckpt / "manifest.sha256").write_text(f"{_sha(ckpt / 'manifest.json')}  manifest.json\n")


def _checkpoint_files(template):
    with open(template / "checkpoints" / f"step-{STEP}" / "manifest.json", encoding="utf-8") as f:
        return sorted(json.load(f)["files"]) + ["manifest.sha256"]


def _damage(path, kind, data=None):
    raw = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(raw[: (data if data is not None else len(raw) // 2) % max(1, len(raw))])
    elif kind == "flip":
        bit = (data if data is not None else len(raw) * 4) % (8 * len(raw))
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(flipped))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "delete":
        path.unlink()
    elif kind == "bytes":
        path.write_bytes(data)
    elif kind == "json":
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        raise AssertionError(kind)


# ---- the manifest catches damage ------------------------------------------------------
@pytest.mark.parametrize("kind", ["truncate", "flip", "empty", "delete"])
def test_damaged_file_is_refused_naming_it(template, fresh, kind):
    for name in _checkpoint_files(template) + ["manifest.json"]:
        run, ckpt = fresh()
        _damage(ckpt / name, kind)
        with pytest.raises(DataError) as info:
            _resume(run, ckpt)
        message = str(info.value)
        assert "\n" not in message
        assert name in message or "manifest" in message, message


@pytest.mark.parametrize("entry", [5, None, "x", [], {}, {"bytes": 1}, {"sha256": "0" * 64},
                                   {"bytes": "38728", "sha256": "0" * 64}, {"bytes": 1, "sha25\u0007": "0"}])
def test_malformed_manifest_entries_are_refused(fresh, entry):
    run, ckpt = fresh()
    with open(ckpt / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["files"]["model.safetensors"] = entry
    (ckpt / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    _reseal(ckpt)  # the entry's own check, not the digest's
    with pytest.raises(DataError, match="manifest"):
        _resume(run, ckpt)


def test_dangling_latest_and_auto(template, fresh):
    run, ckpt = fresh()
    (run / "checkpoints" / "latest").write_text("step-999\n")
    assert _resume(run, "auto").state.global_step == STEP  # falls back to the newest complete checkpoint
    run, ckpt = fresh()
    _damage(ckpt / "model.safetensors", "flip")
    trainer = _resume(run, "auto")  # the only checkpoint is damaged: a fresh start, with a warning
    assert trainer.state.global_step == STEP  # ... that trains the 3 steps anew


# ---- fuzz: anything, manifest as written or re-signed ----------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)
damage = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("flip"), st.integers(0, 10**7)),
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("json"), json_values),
    st.tuples(st.just("empty"), st.none()),
)


@FUZZ
@given(target=st.sampled_from(["model.safetensors", "optimizer.safetensors", "trainer.json", "manifest.json",
                                "manifest.sha256"]),
       change=damage, resign=st.booleans())
def test_any_damage_is_refused_with_data_error(fresh, target, change, resign):
    run, ckpt = fresh()
    kind, data = change
    _damage(ckpt / target, kind, data)
    if target == "manifest.sha256":
        words = (ckpt / target).read_bytes().split() if (ckpt / target).exists() else []
        intact = bool(words) and words[0].lower() == _sha(ckpt / "manifest.json").encode()
        try:
            _resume(run, ckpt)
        except DataError as exc:
            assert not intact and "\n" not in str(exc) and "manifest" in str(exc)
            return
        assert intact, f"{kind} of the manifest's digest was not detected"  # only the file name after it changed
        return
    if resign and target != "manifest.json":
        _resign(ckpt)
    try:
        _resume(run, ckpt)
    except DataError as exc:
        assert "\n" not in str(exc)
        return
    except ConfigError as exc:  # a re-signed trainer.json whose damage changed a setting: refused as a changed run
        assert resign and target == "trainer.json" and str(exc).startswith("resume: ") and "\n" not in str(exc)
        return
    # a load may only succeed when the damage left a well-formed, re-signed file
    assert resign or target == "manifest.json", f"{kind} of {target} was not detected"
    assert kind in ("flip", "json", "truncate", "bytes") or target == "manifest.json"


@FUZZ
@given(meta=st.data())
def test_trainer_json_with_the_right_keys_and_wrong_values_is_refused(template, fresh, meta):
    run, ckpt = fresh()
    with open(ckpt / "trainer.json", encoding="utf-8") as f:
        real = json.load(f)
    broken = dict(real)
    for key in meta.draw(st.lists(st.sampled_from(sorted(real)), min_size=1, max_size=3, unique=True), label="keys"):
        broken[key] = meta.draw(json_values, label=key)
    _damage(ckpt / "trainer.json", "json", broken)
    _resign(ckpt)
    try:
        _resume(run, ckpt)
    except DataError:
        return
    except ConfigError as exc:  # re-signed values that describe another run (train_samples 1, not 40): refused as
        assert str(exc).startswith("resume: ") and "\n" not in str(exc)  # a changed run, in one line
        return
    # accepted: then the values must have been usable; the run must be at the saved step
    # (a value the loader does not read, such as args, may legitimately be anything)


@FUZZ
@given(content=st.binary(max_size=64) | st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_latest_pointer_with_any_content(fresh, content):
    run, _ = fresh()
    (run / "checkpoints" / "latest").write_bytes(content)
    try:
        trainer = _resume(run, "auto")
    except DataError:
        return
    assert trainer.state.global_step == STEP


# ---- pickle is never executed -----------------------------------------------------------
class _Payload:
    """Unpickling this creates the file ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_planted_pickle_is_never_executed(fresh, tmp_path):
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Payload(str(marker)), protocol=2)
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(str(control)), protocol=2)).close()
    assert control.exists(), "the payload must be live for this test to mean anything"

    # 1. paddle-style files next to the real ones, referenced from a re-signed trainer.json
    run, ckpt = fresh()
    for name in ("model.pdparams", "optimizer.pdopt", "rng_state.pkl", "scheduler.pdparams"):
        (ckpt / name).write_bytes(payload)
    with open(ckpt / "trainer.json", encoding="utf-8") as f:
        meta = json.load(f)
    meta.update({"model_file": "model.pdparams", "optimizer_file": "optimizer.pdopt", "format": "paddle",
                 "rng_file": "rng_state.pkl"})
    (ckpt / "trainer.json").write_text(json.dumps(meta), encoding="utf-8")
    _resign(ckpt)
    trainer = _resume(run, ckpt)
    trainer.load_checkpoint(str(ckpt))  # and directly, through Trainer.load_checkpoint
    assert not marker.exists()

    # 2. the payload in place of each tensor file (re-signed): refused, not run
    for name in ("model.safetensors", "optimizer.safetensors"):
        run, ckpt = fresh()
        (ckpt / name).write_bytes(payload)
        _resign(ckpt)
        with pytest.raises(DataError):
            _resume(run, ckpt)
        assert not marker.exists()

    # 3. only paddle-style files, no safetensors at all
    run, ckpt = fresh()
    for name in ("model.safetensors", "optimizer.safetensors"):
        (ckpt / name).unlink()
    (ckpt / "model.pdparams").write_bytes(payload)
    (ckpt / "optimizer.pdopt").write_bytes(payload)
    _resign(ckpt)
    with pytest.raises(DataError):
        _resume(run, ckpt)
    assert not marker.exists()


def test_checkpoint_loading_code_has_no_unpickling_call():
    room = os.path.join(REPO, "trainer", "checkpoint")
    names = sorted(n for n in os.listdir(room) if n.endswith(".py"))
    assert {"load.py", "manifest.py", "store.py", "resume.py"} <= set(names)
    source = ""
    for name in names:
        with open(os.path.join(room, name), encoding="utf-8") as f:
            source += f.read()
    assert not re.search(r"\bpickle\.loads?\(|paddle\.load\(|allow_pickle\s*=\s*True|torch\.load\(", source)
