"""Host memory per rank beside PaddleNLP's own Trainer: ``python -m benchmarks memory --against-paddlenlp``.

The same PaddleNLP-style script (``benchmarks/llama_script.py``: a random-init ``LlamaForCausalLM``, AdamW,
PaddleNLP's TrainingArguments and clipping) runs as written and with only its Trainer import changed to ours, on
``--nproc`` gloo processes (``paddle.distributed.launch``, the same launcher for both), per mode:

====================  ====================================================================
``dp``                data parallel
``stage1``            ``--sharding stage1`` (fleet's DygraphShardingOptimizer)
``recompute``         data parallel, ``--recompute true``
``stage1+recompute``  both
====================  ====================================================================

Per mode and trainer: each rank's peak resident set (``ru_maxrss``), peak address space (``VmPeak``), the median
CPU time of a step after the first (every thread of the rank; shown as ours / PaddleNLP's of the same run, the
only form in which it survives a loaded machine) and the last logged loss. With ``--find-largest``: the most
decoder layers that train ``--probe-steps`` steps with every process of the launch under ``prlimit --as
--limit-mib`` (the same doubling-then-bisection search for both trainers; a probe that fails or outlives
``--probe-timeout`` does not fit).

A rank's peak resident set moves by 10-35 MiB from one run of the same trainer to the next (other threads'
allocations land at moments the scheduler decides and move where the training's blocks go): ``--repeat N`` runs
each trainer N times, alternating, and gives the medians and ranges. ``--malloc-trace DIR`` runs the table under
``benchmarks/malloc_trace.c`` and prints both trainers' allocations side by side, per step event. A probe of the
search that fails for a reason other than memory (its logs name none) is launched again, never read as "does not
fit" silently.

PaddleNLP's default ``report_to`` (VisualDL) crashes here (issue 39), so both run with ``--report_to none``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks import common, malloc_trace

SCRIPT = os.path.join(common.REPO, "benchmarks", "llama_script.py")
MODES = ("dp", "stage1", "recompute", "stage1+recompute")
TRAINERS = ("paddlenlp", "ours")
PRLIMIT = shutil.which("prlimit")


def mode_flags(mode: str) -> list:
    parts = mode.split("+")
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r} beside PaddleNLP: choose from {', '.join(MODES)}")
    return (["--sharding", "stage1"] if "stage1" in parts else []) + \
        (["--recompute", "true"] if "recompute" in parts else [])


#: what a rank's log says when the address-space limit stopped it (paddle's allocator, glibc, a thread's stack)
OUT_OF_MEMORY = ("MemoryError", "ResourceExhausted", "Cannot allocate memory", "std::bad_alloc",
                 "can't start new thread", "Resource temporarily unavailable")


def run(a, trainer: str, mode: str, layers: int, steps: int, limit_mib: int = 0, timeout: float = 1800,
        env_extra: dict | None = None, why: list | None = None):
    """One launch; the ranks' measurements, or None when it failed under a limit (then ``why`` gets "out of memory",
    "timed out" or the failure's last lines: a launch can fail for another reason, a port taken on a busy machine)."""
    tmp = tempfile.mkdtemp(prefix=f"bench-beside-{trainer}-")
    try:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.nproc), "--master",
               f"127.0.0.1:{common.free_port()}", "--log_dir", os.path.join(tmp, "log"), SCRIPT,
               "--output_dir", os.path.join(tmp, "out"), "--per_device_train_batch_size", str(a.batch),
               "--max_steps", str(steps), "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no",
               "--device", "cpu", "--learning_rate", "1e-4", "--disable_tqdm", "true", "--seed", "42",
               "--num_hidden_layers", str(layers), "--hidden_size", str(a.hidden), "--seq_length", str(a.seq),
               "--intermediate_size", str(a.intermediate), "--num_attention_heads", str(a.heads),
               "--vocab_size", str(a.vocab), *mode_flags(mode)]
        if limit_mib:
            if PRLIMIT is None:
                raise common.BenchmarkError("--find-largest needs prlimit (util-linux) on PATH")
            cmd = [PRLIMIT, f"--as={limit_mib * 2**20}", "--"] + cmd
        threads = str(max(1, (os.cpu_count() or 1) // a.nproc))
        env = common.child_env({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
                                "LLAMA_SCRIPT_TRAINER": trainer, **(env_extra or {})})
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            (why if why is not None else []).append("timed out")
            return None
        files = [os.path.join(tmp, "out", f"measure-rank{r}.json") for r in range(a.nproc)]
        if proc.returncode != 0 or not all(os.path.exists(f) for f in files):
            text = out + common.launch_logs(os.path.join(tmp, "log"))
            if limit_mib:
                oom = any(mark in text for mark in OUT_OF_MEMORY)
                (why if why is not None else []).append("out of memory" if oom else text[-3000:])
                return None
            raise common.BenchmarkError(f"{trainer} {mode} failed ({proc.returncode}): {' '.join(cmd)}\n"
                                        f"{out[-1500:]}{common.launch_logs(os.path.join(tmp, 'log'))}")
        return common.read_json_files(files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def table_run(a, trainer: str, mode: str, env, log, relaunched: list, attempts: int = 3) -> list:
    """One run of the table. A launch that fails is launched again (``attempts`` in all), as a search's probe is: on
    a loaded machine a rank can die for a reason that is not the training's (a port taken between the check and the
    bind, a gloo socket reset as the other rank exits). Each failure is logged with its last lines and named in the
    report (``relaunched``); the figures come only from a launch whose every rank ended with 0."""
    for attempt in range(1, attempts + 1):
        try:
            return run(a, trainer, mode, a.layers, a.steps, env_extra=env)
        except common.BenchmarkError as e:
            if attempt == attempts:
                raise
            relaunched.append(str(e).split(": ", 1)[0])  # "ours stage1 failed (-6)"
            log(f"  {trainer} {mode}: the launch failed, launched again ({attempt} of {attempts - 1})\n{str(e)[-1500:]}")


def kill_tree(proc) -> None:
    """The launcher and every process under it (paddle's launcher starts each rank in a session of its own)."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    os.killpg(proc.pid, 9)
    proc.communicate()


def largest(a, trainer: str, mode: str, log, attempts: int = 3) -> dict:
    """Double the layers until a probe fails, then bisect to one layer. A probe that fails for a reason other than
    memory (its logs name none) is launched again, ``attempts`` in all; if it never trains, it counts as not fitting,
    and ``failures`` keeps its last lines."""
    fits, fails, tried, failures, layers = 0, None, [], {}, a.start_layers
    while fails is None or fails - fits > 1:
        if fails is None and layers > a.max_layers:
            break
        why: list = []
        for _ in range(attempts):
            ok = run(a, trainer, mode, layers, a.probe_steps, a.limit_mib, timeout=a.probe_timeout, why=why) is not None
            if ok or why[-1] in ("out of memory", "timed out"):
                break
            log(f"  {trainer} {mode}: {layers} layers failed, not for memory: launched again\n{why[-1][-600:]}")
        if not ok and why[-1] not in ("out of memory", "timed out"):
            failures[layers] = why[-1]
        tried.append((layers, ok))
        log(f"  {trainer} {mode}: {layers} layers " + ("trains" if ok else f"does not fit ({reason(why[-1])})"))
        if ok:
            fits = layers
        else:
            fails = layers
        layers = layers * 2 if fails is None else (fits + fails) // 2
    return {"trainer": trainer, "mode": mode, "layers": fits, "tried": tried, "capped": fails is None,
            "failures": failures}


def reason(why: str) -> str:
    return why if why in ("out of memory", "timed out") else "failed, not for memory"


def probes(search: dict) -> str:
    """``4 ✓, 8 ✗ (out of memory), ...`` for each trainer of one mode's search."""
    return "; ".join(f"{trainer}: " + ", ".join(f"{n} {'✓' if ok else '✗'}" + (" (failed, not for memory)" if n in
                                                 search[trainer].get("failures", {}) else "")
                                                 for n, ok in search[trainer]["tried"])
                     for trainer in TRAINERS)


def summary(ranks: list) -> dict:
    cpu = [common.median(r["step_cpu_s"][1:] or r["step_cpu_s"]) for r in ranks]
    return {"peak_rss_mb": max(r["peak_rss_mb"] for r in ranks), "peak_vm_mb": max(r["peak_vm_mb"] for r in ranks),
            "step_cpu_s": max(cpu), "loss": ranks[0]["losses"][-1] if ranks[0]["losses"] else None,
            "losses": ranks[0]["losses"]}


def measure(a, log) -> dict:
    """The table's runs (each mode: PaddleNLP's, then ours, ``--repeat`` times) and, asked for, the largest-model
    search. A repeated row gives each figure's median over the runs, and every run's peaks."""
    table, search = [], []
    for mode in common.split_list(a.modes):
        mode_flags(mode)
        row = {"mode": mode}
        runs: dict = {t: [] for t in TRAINERS}
        for attempt in range(0 if a.no_table else a.repeat):
            for trainer in TRAINERS:
                env = malloc_trace.preload(a.malloc_trace, f"{mode}-{trainer}-{attempt}") if a.malloc_trace else None
                ranks = table_run(a, trainer, mode, env, log, row.setdefault("relaunched", []))
                runs[trainer].append({"ranks": ranks, **summary(ranks)})
                log(f"  {mode} {trainer}: peak RSS {runs[trainer][-1]['peak_rss_mb']:.0f} MiB, "
                    f"address space {runs[trainer][-1]['peak_vm_mb']:.0f} MiB")
        if not a.no_table:
            for trainer in TRAINERS:
                row[trainer] = {**runs[trainer][0], "runs": runs[trainer], **{
                    key: common.median(r[key] for r in runs[trainer]) for key in ("peak_rss_mb", "peak_vm_mb", "step_cpu_s")}}
            table.append(row)
            if a.malloc_trace:
                log(malloc_trace.side_by_side(a.malloc_trace, f"{mode}-paddlenlp-0", f"{mode}-ours-0"))
        if a.find_largest:
            found = {t: largest(a, t, mode, log) for t in TRAINERS}
            search.append({"mode": mode, **found})
    return {"table": table, "largest": search}


def report(result: dict, a) -> str:
    rows = []
    search = {r["mode"]: r for r in result["largest"]}
    for r in result["table"] or [{"mode": m, "paddlenlp": None, "ours": None} for m in search]:
        if r["ours"] is None:
            s = search[r["mode"]]
            rows.append([r["mode"], "", "", "", "", f"{s['ours']['layers']} / {s['paddlenlp']['layers']}"])
            continue
        theirs, ours = r["paddlenlp"], r["ours"]
        drift = max((abs(x - y) for x, y in zip(theirs["losses"], ours["losses"])), default=float("nan"))
        rss = f"{ours['peak_rss_mb']:.0f} / {theirs['peak_rss_mb']:.0f} ({ours['peak_rss_mb'] / theirs['peak_rss_mb']:.3f})"
        if len(ours["runs"]) > 1:
            rss += " [" + " / ".join("–".join(f"{f(x['peak_rss_mb'] for x in t['runs']):.0f}" for f in (min, max))
                                     for t in (ours, theirs)) + "]"
        row = [r["mode"], rss,
               f"{ours['peak_vm_mb']:.0f} / {theirs['peak_vm_mb']:.0f}",
               common.fmt(ours["step_cpu_s"] / theirs["step_cpu_s"], 3), f"{drift:.1e}"]
        if r["mode"] in search:
            s = search[r["mode"]]
            row.append(f"{s['ours']['layers']} / {s['paddlenlp']['layers']}"
                       + (" (cap)" if s["ours"]["capped"] or s["paddlenlp"]["capped"] else ""))
        rows.append(row)
    runs = f"median of {a.repeat} runs [each trainer's range]" if a.repeat > 1 else "one run"
    headers = ["mode", f"peak RSS a rank, ours / PaddleNLP (MiB; {runs})", "peak address space a rank, ours / PaddleNLP (MiB)",
               "CPU a step, ours / PaddleNLP", "largest loss difference"]
    if search:
        headers.append(f"largest model under prlimit --as {a.limit_mib} MiB, ours / PaddleNLP (layers)")
    searched = "".join(f"\nProbes (layers) of {mode}: {probes(s)}." for mode, s in search.items())
    searched += "".join(f"\nLaunched again after a failure, {r['mode']}: {'; '.join(r['relaunched'])}."
                        for r in result["table"] if r.get("relaunched"))
    return (f"Beside PaddleNLP's Trainer ({a.nproc} gloo processes; LlamaForCausalLM, hidden {a.hidden}, "
            f"intermediate {a.intermediate}, {a.heads} heads, sequence {a.seq}, vocabulary {a.vocab}, per-device batch "
            f"{a.batch}, AdamW; the table: {a.layers} layers, {a.steps} steps):\n\n"
            + common.markdown_table(headers, rows) + "\n" + searched + ("\n" if searched else ""))


def add_arguments(p) -> None:
    g = p.add_argument_group("beside PaddleNLP's Trainer (--against-paddlenlp)")
    g.add_argument("--against-paddlenlp", action="store_true",
                   help="run benchmarks/llama_script.py on PaddleNLP's Trainer and on ours, modes " + ", ".join(MODES)
                   + "; the options not given then default to issue 41's Llama: hidden 512, 10 layers, 8 heads, "
                   "sequence 128, vocabulary 8000, per-device batch 2, 6 steps, --limit-mib 3072, 3 probe steps")
    g.add_argument("--intermediate", type=int, default=1376, help="Llama feed-forward size (with --against-paddlenlp)")
    g.add_argument("--repeat", type=int, default=1,
                   help="runs of each trainer per mode, alternating (with --against-paddlenlp; default 1): the table "
                   "gives the medians and each trainer's range of peak RSS (a rank's peak varies by ~2%% from run to run)")
    g.add_argument("--malloc-trace", metavar="DIR",
                   help="run the table's runs under benchmarks/malloc_trace.c (LD_PRELOAD; needs a C compiler), its "
                   "files in DIR, and print each mode's first runs side by side, per step event")


def beside_defaults(a, given) -> None:
    """The Llama shape of issue 41 where the option was not given on the command line."""
    defaults = {"hidden": 512, "layers": 10, "heads": 8, "seq": 128, "vocab": 8000, "batch": 2, "steps": 6,
                "limit_mib": 3072, "probe_steps": 3, "modes": ",".join(MODES), "probe_timeout": 900}
    for name, value in defaults.items():
        if f"--{name.replace('_', '-')}" not in given:
            setattr(a, name, value)
