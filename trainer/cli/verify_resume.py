"""``ptrain verify-resume``: prove, on your own setup, that resuming is exact.

Three runs of the same command line (``python -m trainer.cli run TASK ...``
with ``--max_steps 2N --save_strategy steps --save_steps N --logging_steps 1
--report_to jsonl``), each in a fresh process:

1. **uninterrupted**: 2N steps in one process;
2. **interrupted**: the same run, preempted by a SIGTERM right after step N
   (the signal is raised inside the process at exactly that step, and the
   ``Preemption`` callback saves ``step-N`` and exits as it would on a
   cluster);
3. **resumed**: a fresh process with ``--resume_from_checkpoint auto`` in a
   copy of the interrupted run's directory, continuing to step 2N.

The interrupted run plans 2N steps like the others (a run of ``--max_steps
N`` would have another learning-rate schedule, i.e. be another run). Then the
losses (every record of ``metrics.jsonl``: loss, learning rate, gradient norm,
evaluation metrics) are compared step by step, and the two step-2N checkpoints
tensor by tensor (``model.safetensors`` and ``optimizer.safetensors``, read
with ``safetensors.numpy``; nothing is unpickled), plus the RNG states. The
report names the first divergence (step, tensor, largest absolute difference)
or says the runs are identical, bit for bit. The two step-N checkpoints are
compared too: when they already differ, training itself is not deterministic
on this setup and the divergence is not the resume's fault.

    >>> ok, report = verify_resume("digits", None, ["--hidden_size", "32"], steps=10, workdir="/tmp/vr")  # doctest: +SKIP
    >>> print(report)  # doctest: +SKIP

Only single-process runs are verified (the comparison runs each half in one
process). ``ptrain verify-resume`` exits 0 when the runs are identical,
:data:`DIVERGED_EXIT_CODE` when they are not, and with the failing run's own
code when a run fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, TrainerError
from .run import resolve_run

DIVERGED_EXIT_CODE = 6
# verify-resume sets these itself; a user override would break the comparison
CONTROLLED = ("output_dir", "max_steps", "logging_steps", "save_strategy", "save_steps", "save_total_limit",
              "resume_from_checkpoint", "report_to")
# log keys that measure time or hardware, not the run; everything else in metrics.jsonl must match
_TIMING_SUFFIXES = ("_per_second", "_time", "_seconds", "_runtime", "_share")
_TIMING_PREFIXES = ("gpu", "cpu_", "rss_", "data_wait", "time")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


# ---- running ----------------------------------------------------------------------------
class RunFailed(TrainerError):
    """One of the three runs exited with an error; carries its exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code if exit_code > 0 else 1


def _run_args(task: str, recipe: Optional[str], overrides: Sequence[str], steps: int, output_dir: str) -> List[str]:
    cmd = ["run", task] + (["--recipe", recipe] if recipe else []) + list(overrides)
    return cmd + ["--output_dir", output_dir, "--max_steps", str(2 * steps), "--logging_steps", "1",
                  "--save_strategy", "steps", "--save_steps", str(steps), "--save_total_limit", "none",
                  "--report_to", "jsonl"]


def _check_overrides(overrides: Sequence[str]) -> None:
    for token in overrides:
        name = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        if name in CONTROLLED:
            raise ConfigError(f"verify-resume sets --{name} itself: remove it (it controls {', '.join(CONTROLLED)})")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class _Run:
    """One ``python -m ...`` process of the check, its log and its stamp (for ``reuse``)."""

    def __init__(self, name: str, module_args: List[str], workdir: str):
        self.name, self.module_args = name, module_args
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.stamp_path = os.path.join(workdir, f"{name}.json")
        self.proc: Optional[subprocess.Popen] = None
        self.seconds = 0.0
        self.reused = False

    def reusable(self) -> bool:
        if not os.path.isfile(self.stamp_path):
            return False
        with open(self.stamp_path, encoding="utf-8") as f:
            return json.load(f).get("argv") == self.module_args

    def start(self, reuse: bool = False) -> "_Run":
        if reuse and self.reusable():
            self.reused = True
            return self
        if os.path.exists(self.stamp_path):
            os.remove(self.stamp_path)
        self._t0 = time.perf_counter()
        log = open(self.log_path, "w", encoding="utf-8")
        log.write("$ " + " ".join([sys.executable, "-m"] + self.module_args) + "\n")
        log.flush()
        self.proc = subprocess.Popen([sys.executable, "-m"] + self.module_args, stdout=log,
                                     stderr=subprocess.STDOUT, env=_env(), cwd=os.getcwd())
        log.close()
        return self

    def stop(self) -> None:
        """Kill the process if it still runs (another run failed, or the user interrupted)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def finish(self, ok_codes: Sequence[int], timeout: Optional[float]) -> "_Run":
        if self.reused:
            return self
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RunFailed(f"the {self.name} run did not finish within {timeout:.0f} s: see {self.log_path}", 1) from None
        self.seconds = time.perf_counter() - self._t0
        if code not in ok_codes:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.strip()]
            last = lines[-1] if lines else "(no output)"
            raise RunFailed(f"the {self.name} run failed (exit code {code}): {last} -- full log: {self.log_path}", code)
        with open(self.stamp_path, "w", encoding="utf-8") as f:
            json.dump({"argv": self.module_args, "exit_code": code, "seconds": round(self.seconds, 2)}, f)
        return self

    def took(self) -> str:
        return "reused from an earlier check" if self.reused else f"{self.seconds:.1f} s"


# ---- comparing --------------------------------------------------------------------------
def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items()
            if k != "step" and not k.endswith(_TIMING_SUFFIXES) and not k.startswith(_TIMING_PREFIXES)}


def _read_records(path: str) -> List[Tuple[int, dict]]:
    if not os.path.isfile(path):
        raise RunFailed(f"{path} was not written: the run logged nothing to compare", 1)
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                values = _comparable(record)
                if values and isinstance(record.get("step"), int):
                    out.append((record["step"], values))
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)  # NaN logged identically counts as the same
    return a == b


def compare_records(reference: List[Tuple[int, dict]], other: List[Tuple[int, dict]]) -> Optional[str]:
    """None when the two logs hold the same records; else the first difference, as a sentence."""
    for (step_a, rec_a), (step_b, rec_b) in zip(reference, other):
        if step_a != step_b:
            return f"step {min(step_a, step_b)}: the uninterrupted run logged step {step_a}, the resumed run step {step_b}"
        for key in sorted(set(rec_a) | set(rec_b)):
            if key not in rec_b:
                return f"step {step_a}: {key} logged only by the uninterrupted run"
            if key not in rec_a:
                return f"step {step_a}: {key} logged only by the resumed run"
            a, b = rec_a[key], rec_b[key]
            if not _same(a, b):
                numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
                diff = f", |diff| {abs(a - b):.3g}" if numbers else ""
                return f"step {step_a}: {key} {a!r} (uninterrupted) vs {b!r} (resumed){diff}"
    if len(reference) != len(other):
        longer, which = (reference, "uninterrupted") if len(reference) > len(other) else (other, "resumed")
        step = longer[min(len(reference), len(other))][0]
        return f"step {step}: only the {which} run logged this and {abs(len(reference) - len(other)) - 1} more record(s)"
    return None


def _load_tensors(path: str) -> Dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    if not os.path.isfile(path):
        raise RunFailed(f"{path} is missing: the run did not save the checkpoint to compare", 1)
    return load_file(path)


def compare_tensors(path_a: str, path_b: str) -> Tuple[Optional[str], int, int]:
    """Compare two safetensors files bit for bit.

    Returns (None, tensors, values) when identical; else (a sentence naming the
    first differing tensor in file order and by how much, and how many differ,
    tensors, values).
    """
    a, b = _load_tensors(path_a), _load_tensors(path_b)
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        return (f"different tensor names: only in the uninterrupted run {only_a[:3]}, only in the resumed run "
                f"{only_b[:3]}", len(a), 0)
    first, differing, values = None, 0, 0
    for name in a:  # file order (safetensors keeps the keys sorted)
        x, y = a[name], b[name]
        values += x.size
        if x.shape != y.shape or x.dtype != y.dtype:
            differing += 1
            first = first or f"{name}: shape/dtype {list(x.shape)}/{x.dtype} vs {list(y.shape)}/{y.dtype}"
        elif x.tobytes() != y.tobytes():
            differing += 1
            if first is None:
                xd, yd = x.astype(np.float64), y.astype(np.float64)
                same = (xd == yd) | (np.isnan(xd) & np.isnan(yd))
                diff = np.abs(xd - yd)[~same]
                worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
                first = (f"{name} (shape {list(x.shape)}): max |diff| {worst:.3g}, "
                         f"{int(diff.size)} of {x.size} values differ")
    if first is None:
        return None, len(a), values
    return f"{first} ({differing} of {len(a)} tensors differ)", len(a), values


def _rng_of(checkpoint: str):
    with open(os.path.join(checkpoint, "trainer.json"), encoding="utf-8") as f:
        meta = json.load(f)
    return meta.get("rng_per_rank", meta.get("rng"))


# ---- the check --------------------------------------------------------------------------
def verify_resume(task: str, recipe: Optional[str], overrides: Sequence[str], steps: int, workdir: str,
                  resume_overrides: Sequence[str] = (), parallel: bool = False, reuse: bool = False,
                  timeout: Optional[float] = None) -> Tuple[bool, str]:
    """Run the uninterrupted, interrupted and resumed runs in ``workdir``; compare them.

    Args:
        task, recipe, overrides: what ``ptrain run TASK --recipe R --field value ...`` takes.
        steps: N; the interruption is after step N, the runs end at 2N.
        workdir: where the runs' output directories (``uninterrupted``, ``interrupted``,
            ``resumed``) and logs go.
        resume_overrides: extra ``--field value`` pairs for the resumed process only
            (to see what changing something on resume does; empty for the real check).
        parallel: run the uninterrupted and interrupted runs at the same time (two
            processes; faster on a CPU with cores to spare, needs twice the memory).
        reuse: keep the uninterrupted and interrupted runs of an earlier check in
            ``workdir`` when their command lines are the same (changes to your code
            are not detected: use it to try several ``resume_overrides``).
        timeout: seconds each run may take (None: no limit).

    Returns ``(ok, report)``: ok when the runs are identical bit for bit.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps={steps!r} is not allowed: give an integer N >= 1 (the interruption is after step N)")
    overrides, resume_overrides = list(overrides), list(resume_overrides)
    _check_overrides(overrides)
    _check_overrides(resume_overrides)
    os.makedirs(workdir, exist_ok=True)
    dirs = {name: os.path.join(os.path.abspath(workdir), name) for name in ("uninterrupted", "interrupted", "resumed")}
    full = _Run("uninterrupted", ["trainer.cli"] + _run_args(task, recipe, overrides, steps, dirs["uninterrupted"]),
                workdir)
    part = _Run("interrupted", ["trainer.cli.verify_resume", "--interrupt-after", str(steps), "--"]
                + _run_args(task, recipe, overrides, steps, dirs["interrupted"]), workdir)
    resumed = _Run("resumed", ["trainer.cli"] + _run_args(task, recipe, overrides, steps, dirs["resumed"])
                   + ["--resume_from_checkpoint", "auto"] + resume_overrides, workdir)
    for run in (full, part):
        if not (reuse and run.reusable()):
            shutil.rmtree(dirs[run.name], ignore_errors=True)

    preempted = 128 + signal.SIGTERM
    try:
        full.start(reuse)
        if not parallel:
            full.finish((0,), timeout)
        part.start(reuse).finish((0, preempted), timeout)
        if parallel:
            full.finish((0,), timeout)
        # resume a copy, so the interrupted run stays as it was left (and can be reused)
        shutil.rmtree(dirs["resumed"], ignore_errors=True)
        shutil.copytree(dirs["interrupted"], dirs["resumed"], symlinks=True)
        resumed.start().finish((0,), timeout)
    finally:
        for run in (full, part, resumed):
            run.stop()
    return _compare(task, recipe, steps, dirs, (full, part, resumed), resume_overrides)


def _compare(task, recipe, steps, dirs, runs, resume_overrides) -> Tuple[bool, str]:
    n, end = steps, 2 * steps
    full, part, resumed = runs
    ckpt = lambda name, s: os.path.join(dirs[name], "checkpoints", f"step-{s}")  # noqa: E731
    lines = [f"verify-resume {task}" + (f" --recipe {recipe}" if recipe else "") + f": N={n}",
             f"  uninterrupted  steps 1-{end} in one process ({full.took()})",
             f"  interrupted    SIGTERM after step {n}, checkpoint step-{n} ({part.took()})",
             f"  resumed        a fresh process, --resume_from_checkpoint auto, steps {n + 1}-{end} ({resumed.took()})"
             + (f", with {' '.join(resume_overrides)}" if resume_overrides else "")]
    verdicts = []

    # before the interruption: are the two first halves the same? (determinism, not resume)
    before = None
    for part_name in ("model", "optimizer"):
        before = before or compare_tensors(os.path.join(ckpt("uninterrupted", n), f"{part_name}.safetensors"),
                                           os.path.join(ckpt("interrupted", n), f"{part_name}.safetensors"))[0]
    lines.append(f"  step-{n} checkpoints (before the resume): " + ("identical" if before is None else f"DIFFER: {before}"))

    reference = _read_records(os.path.join(dirs["uninterrupted"], "metrics.jsonl"))
    other = _read_records(os.path.join(dirs["resumed"], "metrics.jsonl"))
    loss_diff = compare_records(reference, other)
    keys = sorted({k for _, r in reference for k in r})
    span = f"steps {reference[0][0]}-{reference[-1][0]}; " if reference else ""
    lines.append(f"  logs: {len(reference)} records ({span}{', '.join(keys)}): "
                 + ("identical" if loss_diff is None else f"first difference at {loss_diff}"))
    if loss_diff is not None:
        verdicts.append(loss_diff)

    tensor_diff = None
    for part_name in ("model", "optimizer"):
        diff, count, values = compare_tensors(os.path.join(ckpt("uninterrupted", end), f"{part_name}.safetensors"),
                                              os.path.join(ckpt("resumed", end), f"{part_name}.safetensors"))
        lines.append(f"  step-{end} {part_name}: {count} tensors, {values:,} values: "
                     + ("identical" if diff is None else f"first difference in {diff}"))
        if diff is not None and tensor_diff is None:
            tensor_diff = f"step {end}, {part_name} tensor {diff}"
    if tensor_diff:
        verdicts.append(tensor_diff)
    rng_same = _rng_of(ckpt("uninterrupted", end)) == _rng_of(ckpt("resumed", end))
    lines.append(f"  step-{end} RNG states (python, numpy, paddle): " + ("identical" if rng_same else "DIFFER"))
    if not rng_same:
        verdicts.append(f"step {end}: the RNG states differ")

    if not verdicts:
        lines.append(f"RESULT: identical (bitwise): resuming after step {n} in a fresh process gives the "
                     "uninterrupted run.")
        return True, "\n".join(lines)
    lines.append("RESULT: DIVERGED. First divergence: " + "; ".join(verdicts[:2]) + ".")
    if before is not None:
        lines.append(f"  note: the two runs already differ at step {n}, before any resume: training is not "
                     "deterministic on this setup (e.g. GPU kernels, data loading order), so this is not "
                     "a resume problem.")
    return False, "\n".join(lines)


def main(task: str, recipe: Optional[str], overrides: Sequence[str], steps: int, workdir: Optional[str],
         parallel: bool = False, reuse: bool = False) -> int:
    """``ptrain verify-resume``: print the report; 0 when identical, DIVERGED_EXIT_CODE otherwise.

    Without ``workdir`` the runs go to a temporary directory, deleted when the
    runs are identical and kept (its path printed) when they are not.
    """
    _check_overrides(overrides)
    resolve_run(task, recipe, None, list(overrides))  # a bad task, recipe or flag fails here, before any directory exists
    temporary = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix=f"ptrain-verify-{task}-")
    try:
        ok, report = verify_resume(task, recipe, overrides, steps, workdir, parallel=parallel, reuse=reuse)
    except BaseException:
        if temporary:
            print(f"ptrain: the runs are kept in {workdir}", file=sys.stderr)
        raise
    print(report)
    if ok and temporary:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"runs and logs: {workdir}")
    return 0 if ok else DIVERGED_EXIT_CODE


# ---- the interrupted run (python -m trainer.cli.verify_resume --interrupt-after N -- run TASK ...) ----
def _interrupted_run(stop_step: int, argv: List[str]) -> int:
    """``ptrain run`` that sends itself SIGTERM right after optimizer step ``stop_step``."""
    import dataclasses
    import logging
    import warnings

    from callbacks import Callback, Preemption

    from .parser import build_parser
    from .run import run_here

    warnings.filterwarnings("ignore", message=".*ccache.*")

    class InterruptAfter(Callback):
        order = 4  # before Preemption (5), which then sees the signal at this very step

        def on_step_end(self, trainer):
            if trainer.state.global_step != stop_step:
                return
            trainer.remove_callback(self)  # leaves no trace in the checkpoint's callback states
            if trainer.callbacks.get(Preemption) is not None:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this hook returns
            else:
                trainer.state.should_save = trainer.state.should_stop = True
            logging.getLogger("trainer.verify_resume").info("interrupting after step %d", stop_step)

    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    try:
        task, options, args = resolve_run(ns.task, ns.recipe, ns.config, extra)
        build = task.build

        def build_with_interrupt(opts, run_args):
            run = build(opts, run_args)
            run.callbacks = list(run.callbacks) + [InterruptAfter()]
            return run

        return run_here(dataclasses.replace(task, build=build_with_interrupt), options, args, dry_run=False)
    except TrainerError as exc:
        print(f"ptrain: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "--interrupt-after" or sys.argv[3] != "--":
        print("usage: python -m trainer.cli.verify_resume --interrupt-after N -- run TASK [...]; "
              "users run ptrain verify-resume", file=sys.stderr)
        sys.exit(2)
    sys.exit(_interrupted_run(int(sys.argv[2]), sys.argv[4:]))
