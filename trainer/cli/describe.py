"""``ptrain inspect``: what a checkpoint holds, and which checkpoints a run has.

:func:`describe_checkpoint` prints one checkpoint: whether its manifest
verifies (or which file is wrong and why), the step and the position in the
epoch, metrics, the best metric, the world size and global batch, a summary of
the arguments, a LoRA adapter (rank, alpha, targets, trainable and total
parameters), the tensors, and the file sizes. :func:`describe_run` lists an
output directory's checkpoints, newest first, with step, time, size and
validity, the one ``latest`` points to, the best, and the adapter of a LoRA run.

Only JSON (``manifest.json``, ``trainer.json``) and safetensors headers are
read: nothing is unpickled or executed, so inspecting a checkpoint someone sent
you is safe. Damaged files are reported, never raised.

    >>> print(describe_run("runs/digits-demo"))          # doctest: +SKIP
    >>> print(describe_checkpoint("runs/digits-demo/checkpoints/latest"))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import List, Optional, Tuple

from ..checkpoint.manifest import (LATEST, MANIFEST, MANIFEST_DIGEST, SUPPORTED_FORMAT_VERSIONS, checkpoints_dir,
                                   safetensors_header, sha256_file, verdict)
from ..checkpoint.store import list_checkpoints, resolve
from ..errors import ConfigError, DataError

# the arguments worth a line in a summary, in reading order
_ARG_SUMMARY = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "num_train_epochs",
                "optim", "learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "weight_decay",
                "max_grad_norm", "amp", "seed", "data_seed", "dataloader_drop_last", "save_strategy", "save_steps",
                "metric_for_best_model")


# ---- small readers (never raise on damaged input) ----------------------------------------
def _read_json(path: str) -> Tuple[Optional[dict], Optional[str]]:
    """(the JSON object, None) or (None, why it could not be read)."""
    if not os.path.isfile(path):
        return None, "missing"
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None, f"unreadable ({type(exc).__name__}: {str(exc)[:80]})"
    if not isinstance(value, dict):
        return None, f"not a JSON object ({type(value).__name__})"
    return value, None


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def _when(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _thousands(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _num(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _dir_size(path: str) -> int:
    total = 0
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            total += os.path.getsize(full)
    return total


def _verdict(path: str) -> Tuple[bool, str]:
    """(whether resume would take it, what it makes of it): ``trainer.checkpoint.manifest.verdict``, resume's own."""
    found = verdict(path)
    if found.status == "unsupported":
        return False, found.text.replace("it is skipped and left as it is", "resume skips it and leaves it as it is")
    return found.status == "valid", found.text


def resolve_pointer(path: str) -> str:
    """``.../checkpoints/latest`` (a file naming a directory) -> that directory."""
    if os.path.isfile(path) and os.path.basename(path.rstrip("/")) == LATEST:
        with open(path, encoding="utf-8", errors="replace") as f:
            return os.path.join(os.path.dirname(path), f.read().strip())
    return path


def _file_checks(path: str, manifest: Optional[dict]) -> List[Tuple[str, str, str]]:
    """(file name, size, status) for every file present or listed; status is "ok" when it verifies."""
    listed = manifest.get("files") if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else {}
    present = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
    out = []
    for name in sorted(set(present) | set(listed)):
        full = os.path.join(path, name)
        meta = listed.get(name)
        if name == MANIFEST:
            status = "the manifest" if manifest is not None else "UNREADABLE manifest"
        elif name == MANIFEST_DIGEST:
            status = "the manifest's digest: " + ("matches" if _digest_matches(path) else "DOES NOT MATCH the manifest")
        elif manifest is None:
            status = "unverified (no readable manifest)"
        elif meta is None:
            status = "not in the manifest (unverified)"
        elif not os.path.isfile(full):
            status = "MISSING"
        elif not isinstance(meta, dict) or os.path.getsize(full) != meta.get("bytes"):
            status = f"WRONG SIZE (manifest says {meta.get('bytes') if isinstance(meta, dict) else '?'} bytes)"
        elif sha256_file(full) != meta.get("sha256"):
            status = "WRONG CONTENT (sha256 differs from the manifest)"
        else:
            status = "ok"
        out.append((name, _size(os.path.getsize(full)) if os.path.isfile(full) else "-", status))
    return out


def _digest_matches(path: str) -> bool:
    try:
        with open(os.path.join(path, MANIFEST_DIGEST), "rb") as f:
            words = f.read(256).split()
        return bool(words) and words[0].decode("ascii", "replace").lower() == sha256_file(os.path.join(path, MANIFEST))
    except OSError:
        return False


def _short_reason(path: str, manifest: Optional[dict], manifest_problem: Optional[str], why: str) -> str:
    """A few words for the run's table, in the order resume checks (``why``: the verdict's whole line)."""
    if manifest is None:
        if manifest_problem == "missing":
            return "no manifest.json (incomplete)"
        return f"manifest.json {manifest_problem.split(':')[0]}" + (")" if "(" in manifest_problem.split(":")[0] else "")
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in SUPPORTED_FORMAT_VERSIONS:
        return f"format_version {version!r} unknown (resume skips it and leaves it as it is)"
    if f"does not match its digest in {MANIFEST_DIGEST}" in why:
        return f"manifest.json changed after it was written (does not match {MANIFEST_DIGEST})"
    for name, _, status in _file_checks(path, manifest):
        if status.isupper() or status.startswith(("MISSING", "WRONG")):
            return f"{name} {status.split(' (')[0].lower()}"
    if " lacks " in why:
        return "lacks " + why.split(" lacks ", 1)[1].split(" that its trainer.json", 1)[0]
    return why.split(f"{path}", 1)[-1].strip(" :/") or "manifest does not verify"


def _tensor_line(path: str, label: str) -> Optional[str]:
    if not os.path.isfile(path):
        return None
    header, problem = safetensors_header(path)
    if header is None:
        return f"  {label}: {problem}"
    count, dtypes = 0, set()
    for meta in header.values():
        if isinstance(meta, dict):
            shape = meta.get("shape") or []
            n = 1
            for d in shape:
                n *= int(d) if isinstance(d, int) else 0
            count += n
            dtypes.add(str(meta.get("dtype")))
    return f"  {label}: {len(header)} tensors, {count:,} values ({', '.join(sorted(dtypes)) or '-'})"


def _layout_text(layout: dict) -> str:
    """One line for the layout a checkpoint records (``trainer.layout.describe()`` and who wrote what)."""
    world = layout.get("world_size", "?")
    head = (f"sharded over {world} ranks, each wrote its own shard" if layout.get("sharded")
            else f"{world} rank(s) holding the same state, written by rank 0")
    rest = ", ".join(f"{k}={v}" for k, v in sorted(layout.items()) if k not in ("world_size", "sharded"))
    return head + (f" ({rest})" if rest else "")


def _shard_lines(path: str, manifest: Optional[dict]) -> List[str]:
    """Per shard of a sharded checkpoint: its rank and what it holds (from the manifest's index and the file's header)."""
    index = (manifest or {}).get("tensors")
    if not isinstance(index, dict):
        return []
    per_file: dict = {}
    for key, entry in index.items():
        for part in entry.get("parts", []) if isinstance(entry, dict) else []:
            if isinstance(part, dict):
                group = str(key).split("/", 1)[0]
                counts = per_file.setdefault(str(part.get("file")), {"rank": part.get("rank"), "model": 0, "optimizer": 0,
                                                                      "slices": 0})
                counts[group] = counts.get(group, 0) + 1
                counts["slices"] += int("flat" in part or "offsets" in part)
    lines = [f"  tensors: {len(index)} (model {sum(k.startswith('model/') for k in index)}, optimizer "
             f"{sum(k.startswith('optimizer/') for k in index)}) in {len(per_file)} shard(s)"]
    for name, c in sorted(per_file.items()):
        line = _tensor_line(os.path.join(path, name), f"rank {c['rank']} {name}") or f"  rank {c['rank']} {name}: MISSING"
        lines.append(line + f"; model {c['model']}, optimizer {c['optimizer']}"
                     + (f", {c['slices']} slices" if c["slices"] else ""))
    return lines


def _best(meta: dict) -> Optional[str]:
    """``eval_accuracy=0.97 at step-60`` from the Checkpoint callback's record (or the state), if any."""
    args = meta.get("args") if isinstance(meta.get("args"), dict) else {}
    state = meta.get("state") if isinstance(meta.get("state"), dict) else {}
    record = ((meta.get("callbacks") or {}).get("Checkpoint") or {}) if isinstance(meta.get("callbacks"), dict) else {}
    ranked = record.get("best") if isinstance(record, dict) else None
    name = args.get("metric_for_best_model") or "best metric"
    if isinstance(ranked, list) and ranked and isinstance(ranked[0], list) and len(ranked[0]) == 2:
        text = ", ".join(f"{_num(value)} at step-{step}" for value, step in ranked[:3])
        return f"{name}={text}"
    if state.get("best_metric") is not None:
        where = os.path.basename(str(state.get("best_checkpoint") or "").rstrip("/")) or "an unsaved step"
        return f"{name}={_num(state['best_metric'])} at {where}"
    return None


def _adapter_text(adapter) -> Optional[str]:
    """One line for the LoRA adapter a checkpoint records (``trainer.layout.adapters.describe``), or None."""
    if not isinstance(adapter, dict):
        return None
    trainable, total = adapter.get("trainable_parameters"), adapter.get("total_parameters")
    share = (f" ({100.0 * trainable / total:.2f}%)" if isinstance(trainable, int) and isinstance(total, int) and total
             else "")
    targets = adapter.get("target_modules") if isinstance(adapter.get("target_modules"), list) else []
    return (f"{adapter.get('type', '?')} r={adapter.get('r', '?')} alpha={_num(adapter.get('lora_alpha', '?'))} "
            f"scaling={_num(adapter.get('scaling', '?'))} dropout={_num(adapter.get('lora_dropout', '?'))}"
            + (" rslora" if adapter.get("rslora") else "")
            + f" on {adapter.get('adapted_layers', '?')} layers matching {', '.join(map(str, targets)) or '-'}; "
            f"trainable {_num(trainable) if not isinstance(trainable, int) else f'{trainable:,}'} of "
            f"{_num(total) if not isinstance(total, int) else f'{total:,}'} parameters{share}")


def _wrap(prefix: str, text: str, width: int = 100) -> List[str]:
    lines, current = [], prefix
    for word in text.split(" "):
        if len(current) + len(word) > width and current.strip():
            lines.append(current.rstrip())
            current = " " * len(prefix)
        current += word + " "
    lines.append(current.rstrip())
    return lines


def _args_summary(args: dict) -> str:
    from ..args import TrainingArguments

    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(TrainingArguments)}
    shown = [k for k in _ARG_SUMMARY if k in args]
    shown += [k for k in sorted(args) if k not in shown and k not in ("output_dir", "resume_from_checkpoint")
              and k in defaults and args[k] != defaults[k]]
    if "max_steps" in args and isinstance(args["max_steps"], int) and args["max_steps"] > 0 and "num_train_epochs" in shown:
        shown.remove("num_train_epochs")
    return " ".join(f"{k}={_num(args[k])}" for k in shown)


# ---- public ------------------------------------------------------------------------------
def describe_checkpoint(path: str) -> str:
    """A readable account of one checkpoint directory (or of ``checkpoints/latest``).

    Raises ConfigError only when ``path`` is not a directory; a damaged
    checkpoint is described, with the file that is wrong and why.
    """
    path = resolve_pointer(path)
    if not os.path.isdir(path):
        raise ConfigError(f"checkpoint {path} does not exist: give a checkpoint directory "
                          "(OUTPUT_DIR/checkpoints/step-N) or an output directory")
    valid, verdict_text = _verdict(path)
    manifest, manifest_problem = _read_json(os.path.join(path, MANIFEST))
    meta, meta_problem = _read_json(os.path.join(path, "trainer.json"))
    state = meta.get("state") if meta and isinstance(meta.get("state"), dict) else {}
    args = meta.get("args") if meta and isinstance(meta.get("args"), dict) else {}

    lines = [f"checkpoint {os.path.abspath(path)}",
             f"  manifest: {verdict_text if valid else 'INVALID: ' + verdict_text}"]
    if manifest:
        versions = manifest.get("versions") if isinstance(manifest.get("versions"), dict) else {}
        lines.append(f"  written: {_when(manifest.get('time'))}, step {manifest.get('step', '?')}, "
                     f"paddle {versions.get('paddle', manifest.get('paddle', '?'))}, "
                     f"format {manifest.get('format_version', '?')}")
    if meta is None:
        lines.append(f"  trainer.json: {meta_problem}")
    else:
        step, max_steps = state.get("global_step", "?"), state.get("max_steps", "?")
        spe = state.get("steps_per_epoch")
        samples = state.get("samples_seen")
        lines.append(f"  progress: step {step} of {max_steps}; epoch {state.get('epoch', '?')}, "
                     f"step {state.get('step_in_epoch', '?')} of {spe or '?'} in the epoch"
                     + (f"; {samples:,} samples seen" if isinstance(samples, int) else ""))
        world = meta.get("world_size", state.get("world_size", "?"))
        per_device, accumulation = args.get("per_device_train_batch_size", "?"), args.get("gradient_accumulation_steps", "?")
        readers = meta.get("data_world_size", world)  # tensor/pipeline-parallel ranks of one group read one batch
        lines.append(f"  processes: {world}; global batch {state.get('global_batch_size', '?')} "
                     f"({per_device} per device x {accumulation} accumulation x {readers}"
                     + (" data-parallel ranks)" if readers != world else ")"))
        history = state.get("log_history") if isinstance(state.get("log_history"), list) else []
        last = next((r for r in reversed(history) if isinstance(r, dict) and "loss" in r), None)
        if last:
            lines.append("  last log: " + " ".join(f"{k}={_num(last[k])}" for k in ("step", "loss", "learning_rate", "grad_norm")
                                                    if k in last))
        metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
        if metrics:
            lines.append("  metrics (last evaluation): " + " ".join(f"{k}={_num(v)}" for k, v in sorted(metrics.items())))
        best = _best(meta)
        if best:
            lines.append(f"  best: {best}")
        if state.get("status"):
            lines.append(f"  status when saved: {state['status']}")
        if args:
            lines += _wrap("  args: ", _args_summary(args))
        adapter = _adapter_text(meta.get("adapter"))
        if adapter:
            lines += _wrap("  adapter: ", adapter)
        base = meta.get("frozen_base")
        if isinstance(base, dict):
            lines += _wrap("  frozen base: ", f"not saved here ({base.get('tensors', '?')} tensors, "
                           f"{_thousands(base.get('elements'))} values; the resuming script loads it, checked against "
                           "its recorded digest)")
        callbacks = meta.get("callbacks") if isinstance(meta.get("callbacks"), dict) else {}
        with_state = sorted(k for k, v in callbacks.items() if v)
        if callbacks:
            lines.append(f"  callbacks: {', '.join(sorted(callbacks))}"
                         + (f" (with state: {', '.join(with_state)})" if with_state else ""))
        rng = meta.get("rng_per_rank") or meta.get("rng")
        if rng is not None:
            ranks = len(rng) if isinstance(rng, list) and "rng_per_rank" in meta else 1
            lines.append(f"  RNG states: python, numpy, paddle for {ranks} rank(s)")
    layout = (manifest or {}).get("layout") or (meta or {}).get("layout")
    if isinstance(layout, dict):
        lines.append("  layout: " + _layout_text(layout))
    for name, label in (("model.safetensors", "model"), ("optimizer.safetensors", "optimizer")):
        line = _tensor_line(os.path.join(path, name), label)
        if line:
            lines.append(line)
    lines += _shard_lines(path, manifest)
    lines.append("  files:")
    lines += [f"    {name:<28} {size:>9}  {status}" for name, size, status in _file_checks(path, manifest)]
    lines.append(f"  total: {_size(_dir_size(path))}")
    if manifest is None and manifest_problem != "missing":
        lines.append(f"  manifest.json: {manifest_problem}")
    return "\n".join(lines)


def describe_run(output_dir: str) -> str:
    """The checkpoints of a run (``output_dir/checkpoints/step-N``), newest first."""
    root = checkpoints_dir(output_dir)
    if not os.path.isdir(root):
        raise ConfigError(f"{output_dir} has no checkpoints/ folder: give a run's output directory or a checkpoint")
    found = list_checkpoints(output_dir)
    latest_name, latest_note = None, ""
    pointer = os.path.join(root, LATEST)
    if os.path.isfile(pointer):
        with open(pointer, encoding="utf-8", errors="replace") as f:
            latest_name = f.read().strip()
        if not os.path.isdir(os.path.join(root, latest_name)):
            latest_note = f"latest -> {latest_name!r}, which does not exist (auto-resume takes the newest valid one)"
    else:
        latest_note = "no latest pointer (no checkpoint was completed, or it was removed)"

    rows, best, adapter = [], None, None
    for path in found:
        name = os.path.basename(path)
        valid, verdict_text = _verdict(path)
        manifest, manifest_problem = _read_json(os.path.join(path, MANIFEST))
        meta, _ = _read_json(os.path.join(path, "trainer.json"))
        state = meta.get("state") if meta and isinstance(meta.get("state"), dict) else {}
        if valid and best is None and meta:
            best = _best(meta)
        if valid and adapter is None and meta:  # the newest valid checkpoint's
            adapter = _adapter_text(meta.get("adapter"))
        step = name[len("step-"):]
        epoch = f"{state.get('epoch')}/{state.get('step_in_epoch')}" if "epoch" in state else "?"
        metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
        shown = ", ".join(f"{k}={_num(v)}" for k, v in sorted(metrics.items())
                          if not k.endswith("_samples"))[:60]
        marks = ("  <- latest" if name == latest_name else "")
        status = "valid" if valid else "INVALID: " + _short_reason(path, manifest, manifest_problem, verdict_text)
        rows.append(f"  {name:<14} {step:>8}  {epoch:>9}  {_when(manifest.get('time') if manifest else None):<19}  "
                    f"{_size(_dir_size(path)):>9}  {status}{marks}" + (f"\n  {'':<14} {shown}" if shown else ""))
    stray = sorted(n for n in os.listdir(root) if n.startswith((".tmp-", ".old-", ".deleting-")))

    lines = [f"run {os.path.abspath(output_dir)}: {len(found)} checkpoint(s) in {root}"]
    if rows:
        lines.append(f"  {'checkpoint':<14} {'step':>8}  {'epoch/step':>9}  {'written':<19}  {'size':>9}  manifest")
        lines += rows
    if latest_note:
        lines.append("  " + latest_note)
    chosen = auto_choice(output_dir)
    lines.append(f"  resume 'auto' would take: {os.path.basename(chosen) if chosen else 'none (a fresh start)'}")
    if best:
        lines.append(f"  best: {best}")
    if adapter:
        lines += _wrap("  adapter: ", adapter)
    if stray:
        lines.append(f"  leftovers of interrupted saves or deletions (removed at the next save): {', '.join(stray)}")
    damaged = sorted(n for n in os.listdir(root) if n.startswith("step-") and ".damaged" in n)
    if damaged:
        lines.append(f"  set aside as damaged by a resume (kept, never resumed or counted): {', '.join(damaged)}")
    return "\n".join(lines)


def auto_choice(output_dir: str) -> Optional[str]:
    """What ``resume_from_checkpoint='auto'`` would load (its warnings about skipped ones silenced)."""
    import logging

    quiet = logging.getLogger("trainer.checkpoint")
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        return resolve("auto", output_dir, set_aside_damaged=False)  # inspect only reads
    except DataError:
        return None
    finally:
        quiet.disabled = was_disabled


def describe(path: str) -> str:
    """:func:`describe_run` for an output directory (it has ``checkpoints/``), else :func:`describe_checkpoint`."""
    if os.path.isdir(checkpoints_dir(path)):
        return describe_run(path)
    return describe_checkpoint(path)
