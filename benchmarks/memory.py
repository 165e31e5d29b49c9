"""Peak memory per rank and step time of each parallel layout, side by side in one run, and the largest model
that still trains under one fixed per-rank memory limit.

Modes: plain data parallel (``dp``), sharding ``stage1`` / ``stage2`` / ``stage3`` (``trainer.parallel``:
fleet's DygraphShardingOptimizer, paddle's group_sharded), each also with ``recompute``; tensor parallel ``mp2``;
pipeline parallel ``pp2`` (the same network as a ``PipelineLayer``, 2 stages, 2 micro-batches a step). Every mode trains
the same ERNIE-style transformer (token + position embeddings, a LayerList of post-norm encoder layers,
a classifier on the first token; random weights, random tokens; ReLU in the feed-forward: paddle's MKL GELU
gradient segfaults under an address-space limit instead of raising) with AdamW over 2 processes
(``paddle.distributed.launch``; gloo on CPU), the same global batch.

On a CPU build paddle's stages 2 and 3 refuse to start (a device guard and CUDA-only places), so for those
modes each worker loads the test-only shim ``tests/parallel/cpu_sharding_shim.py`` explicitly, and the
report says so; the product code takes paddle's path unchanged.

1. The table (default): per mode, each rank's peak host RSS (``ru_maxrss``) and its growth over the RSS the
   process had before the model was built (paddle, gloo and the data: the same in every mode), the median step
   time of the steps after the first, and both as a ratio to ``dp``.
2. ``--find-largest``: the largest model, in parameters (the number of encoder layers grows, the width stays),
   that trains ``--probe-steps`` steps with every rank under an address-space limit (RLIMIT_AS) of
   ``--limit-mib`` MiB above the address space the rank held before the model was built. The limit is set when
   the first step begins (each rank builds the whole model before paddle shards it). Each probe is its own
   launch (an out-of-memory inside a sharded collective can leave the other rank waiting: a probe that fails
   or does not finish within ``--probe-timeout`` does not fit); layers double until a probe fails, then
   bisect until the gap is within 1/``--precision`` of what fits.

Every mode runs without the default ``NaNGuard`` callback: its parameter check holds the parameters it
found before stage 3 sliced them and fails on them (reported for ``trainer.parallel``). Reported per mode, as a ratio to ``dp`` (with 2 ranks the sharded state can shrink by at most 2x).

Run::

    python -m benchmarks memory                          # hidden 256, 4 layers: a few minutes
    python -m benchmarks memory --full                   # hidden 768, 12 layers, 12 heads (ERNIE base)
    python -m benchmarks memory --find-largest --modes dp,stage3+recompute
    python -m benchmarks memory --against-paddlenlp --find-largest   # beside PaddleNLP's Trainer (memory_beside)
    python -m benchmarks memory --against-paddlenlp --modes recompute --repeat 5 --malloc-trace /tmp/trace
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script by paddle.distributed.launch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common, memory_beside  # noqa: E402

MODES = ("dp", "dp+recompute", "stage1", "stage1+recompute", "stage2", "stage2+recompute", "stage3",
         "stage3+recompute")
MODES += ("mp2", "mp2+recompute")  # tensor parallel 2: models/ernie/parallel_model.py, the same shape
MODES += ("pp2",)  # pipeline parallel 2: the same shape as a PipelineLayer over 2 stages, 2 micro-batches a step
SHIM = os.path.join(common.REPO, "tests", "parallel", "cpu_sharding_shim.py")
HYBRID_SHIM = os.path.join(common.REPO, "tests", "parallel", "cpu_hybrid_shim.py")


def parse_mode(mode: str) -> tuple:
    """``stage3+recompute`` -> (``"stage3"``, True); ``dp`` -> (``""``, False)."""
    base, _, extra = mode.partition("+")
    if base not in ("dp", "stage1", "stage2", "stage3", "mp2", "pp2") or extra not in ("", "recompute") or \
            (base == "pp2" and extra):
        raise SystemExit(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    return ("" if base == "dp" else base), extra == "recompute"


# =============================================================================
# worker (one per rank, under paddle.distributed.launch)
# =============================================================================
def build_model(hidden: int, layers: int, heads: int, vocab: int, seq: int):
    import paddle

    class Encoder(paddle.nn.Layer):
        """ERNIE's shape: embeddings, then ``layers`` encoder blocks in a LayerList, then a classifier."""

        def __init__(self):
            super().__init__()
            self.tokens = paddle.nn.Embedding(vocab, hidden)
            self.positions = paddle.nn.Embedding(seq, hidden)
            self.norm = paddle.nn.LayerNorm(hidden)
            self.layers = paddle.nn.LayerList([
                paddle.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, activation="relu")
                for _ in range(layers)])
            self.classifier = paddle.nn.Linear(hidden, 2)

        def forward(self, input_ids):
            positions = paddle.arange(input_ids.shape[1]).unsqueeze(0)
            h = self.norm(self.tokens(input_ids) + self.positions(positions))
            for layer in self.layers:
                h = layer(h)
            return self.classifier(h[:, 0])

    return Encoder()


def build_tp_model(a, degree: int):
    """The same shape as :func:`build_model` (plus ERNIE's pooler and token types), tensor parallel over ``degree``
    ranks with fleet's parallel layers (ReLU in the feed-forward, as build_model's)."""
    from models.ernie.parallel_model import ErnieTPConfig, ErnieTPForSequenceClassification

    return ErnieTPForSequenceClassification(ErnieTPConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        intermediate_size=4 * a.hidden, max_position_embeddings=a.seq, num_labels=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, hidden_act="relu", tensor_parallel_degree=degree))


def build_pp_model(a, stages: int):
    """:func:`build_model`'s network as a ``PipelineLayer`` over ``stages`` (each rank builds its stage's layers)."""
    import paddle
    from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

    class Embed(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.tokens = paddle.nn.Embedding(a.vocab, a.hidden)
            self.positions = paddle.nn.Embedding(a.seq, a.hidden)
            self.norm = paddle.nn.LayerNorm(a.hidden)

        def forward(self, input_ids):
            positions = paddle.arange(input_ids.shape[1]).unsqueeze(0)
            return self.norm(self.tokens(input_ids) + self.positions(positions))

    class Head(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.classifier = paddle.nn.Linear(a.hidden, 2)

        def forward(self, h):
            return self.classifier(h[:, 0])

    block = dict(d_model=a.hidden, nhead=a.heads, dim_feedforward=4 * a.hidden, dropout=0.0, activation="relu")
    layers = [LayerDesc(Embed)] + [LayerDesc(paddle.nn.TransformerEncoderLayer, **block) for _ in range(a.layers)]
    return PipelineLayer(layers + [LayerDesc(Head)], num_stages=stages, loss_fn=paddle.nn.CrossEntropyLoss())


def _load_shim(path: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)  # TEST-ONLY shim, on purpose
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    shim.install()


def worker(a) -> None:
    common.quiet_paddle_warnings()
    import numpy as np
    import paddle
    import psutil

    from callbacks import Callback, NaNGuard
    from trainer import Trainer, TrainingArguments
    from trainer import distributed as dist

    sharding, recompute = parse_mode(a.mode)
    mp = 2 if sharding == "mp2" else 1
    pp = 2 if sharding == "pp2" else 1
    sharding = "" if mp > 1 or pp > 1 else sharding
    shimmed = (sharding in ("stage2", "stage3") or mp > 1 or pp > 1) and not paddle.is_compiled_with_cuda()
    if shimmed:
        _load_shim(HYBRID_SHIM if mp > 1 or pp > 1 else SHIM)
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.RandomState(0)
    n = a.batch * world * (a.steps + 1)
    ids = rng.randint(0, a.vocab, size=(n, a.seq)).astype("int64")
    labels = rng.randint(0, 2, size=n).astype("int64")

    class Data(paddle.io.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return ids[i], labels[i]

    # paddle loads its math libraries at the first ops: before anything is measured or limited
    warm = paddle.nn.Linear(4, 2)
    paddle.optimizer.AdamW(parameters=warm.parameters()).step()
    warm(paddle.ones([2, 4])).mean().backward()
    del warm
    before_rss = psutil.Process().memory_info().rss / 2**20
    before_vms = psutil.Process().memory_info().vms

    class Measure(Callback):
        def __init__(self):
            self.times = []

        def on_step_begin(self, trainer):
            if a.limit_mib and trainer.state.global_step == 0:
                limit = before_vms + a.limit_mib * 2**20
                resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))  # the soft limit

        def on_step_end(self, trainer):
            self.times.append(trainer.state.last_step_time)

    paddle.seed(0)
    # the same global batch in every mode: the ranks of a tensor-parallel group read the same batch
    # (the stages of a pipeline read the same batch too: 2 micro-batches of a.batch make the step's)
    args = TrainingArguments(output_dir=a.out_dir, per_device_train_batch_size=a.batch * mp, max_steps=a.steps,
                             pipeline_parallel_degree=pp, gradient_accumulation_steps=pp,
                             learning_rate=1e-4, logging_steps=a.steps, report_to=[], save_strategy="no",
                             evaluation_strategy="no", sharding=sharding, recompute=recompute, device="cpu",
                             overwrite_output_dir=True, seed=0, tensor_parallel_degree=mp)
    model = build_tp_model(a, mp) if mp > 1 else build_pp_model(a, pp) if pp > 1 else \
        build_model(a.hidden, a.layers, a.heads, a.vocab, a.seq)
    held = [(int(np.prod(p.shape)), bool(getattr(p, "is_distributed", False))) for p in model.parameters()]
    params = sum(n * (mp if split else 1) for n, split in held)  # the whole model's
    if pp > 1:  # each stage holds its layers: the whole model is every stage's
        counts: list = []
        paddle.distributed.all_gather_object(counts, params)
        params = sum(counts)
    measure = Measure()
    trainer = Trainer(model, args, train_dataset=Data(), loss_fn=paddle.nn.CrossEntropyLoss(), callbacks=[measure])
    # the default NaNGuard keeps the parameters it found at on_fit_begin, before stage 3 slices them, and its check
    # then reads a parameter that holds no memory (found here; reported for trainer.parallel): measured without it
    trainer.remove_callback(NaNGuard)
    try:
        trainer.fit()
    except MemoryError:  # paddle's allocator failed under the limit: this size does not fit (said in a file)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        with open(os.path.join(a.out_dir, f"oom-rank{rank}"), "w", encoding="utf-8") as f:
            f.write("out of memory\n")
        raise
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    loss = [r["loss"] for r in trainer.state.log_history if "loss" in r][-1]
    result = {"rank": rank, "world_size": world, "mode": a.mode, "params": params, "layers": a.layers,
              "before_rss_mb": before_rss, "peak_rss_mb": common.peak_rss_mb(), "loss": loss,
              "step_s": common.median(measure.times[1:] or measure.times), "steps": len(measure.times),
              "shim": shimmed, "params_per_rank": sum(n for n, _ in held),
              "layout": trainer.layout.describe()}
    with open(os.path.join(a.out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


# =============================================================================
# parent
# =============================================================================
def launch(a, mode: str, layers: int, limit_mib: int = 0, timeout: float = 1800, attempts: int = 3):
    """One 2-process run of ``mode``: the ranks' results; under a limit, None when a rank ran out of memory or
    the run did not finish in time (an out-of-memory inside a collective leaves the other rank waiting). A
    failure that is neither (on a busy machine: a port another job took) is tried again, ``attempts`` in all."""
    for attempt in range(attempts):
        result = _launch_once(a, mode, layers, limit_mib, timeout, last=attempt == attempts - 1)
        if result != "retry":
            return result
    return None


def _launch_once(a, mode: str, layers: int, limit_mib: int, timeout: float, last: bool):
    with tempfile.TemporaryDirectory(prefix="bench-memory-", ignore_cleanup_errors=True) as tmp:
        return _launch_in(a, tmp, mode, layers, limit_mib, timeout, last)  # the ranks' logs are in the error


def _launch_in(a, tmp: str, mode: str, layers: int, limit_mib: int, timeout: float, last: bool):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.nproc), "--master",
           f"127.0.0.1:{common.free_port()}", "--log_dir", os.path.join(tmp, "log"), os.path.abspath(__file__), "--worker",
           "--mode", mode, "--out-dir", tmp, "--hidden", str(a.hidden), "--layers", str(layers), "--heads",
           str(a.heads), "--seq", str(a.seq), "--vocab", str(a.vocab), "--batch", str(a.batch), "--steps",
           str(a.steps if not limit_mib else a.probe_steps), "--limit-mib", str(limit_mib)]
    threads = str(max(1, (os.cpu_count() or 1) // a.nproc))
    env = common.child_env({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads), "MALLOC_ARENA_MAX": "2"})
    proc = subprocess.Popen(cmd, cwd=common.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the launcher's session: it and its workers
        proc.communicate()
        return None if limit_mib else "retry"
    files = [os.path.join(tmp, f"rank{r}.json") for r in range(a.nproc)]
    if proc.returncode != 0 or not all(os.path.exists(f) for f in files):
        if limit_mib and any(os.path.exists(os.path.join(tmp, f"oom-rank{r}")) for r in range(a.nproc)):
            return None
        if not last:
            return "retry"
        raise common.BenchmarkError(f"launch failed ({proc.returncode}): {' '.join(cmd)}\n{out[-1500:]}\n"
                                    f"{err[-1500:]}{common.launch_logs(os.path.join(tmp, 'log'))}")
    return common.read_json_files(files)


def find_largest(a, mode: str, log) -> dict:
    """Double the layers until a probe fails, then bisect; each probe one launch under the limit."""
    fits, fails, tried = 0, None, []
    layers = a.start_layers
    while fails is None or fails - fits > max(1, fits // a.precision):
        if fails is None and layers > a.max_layers:
            break
        ok = launch(a, mode, layers, a.limit_mib, timeout=a.probe_timeout)
        tried.append((layers, ok is not None))
        log(f"  {mode}: {layers} layers {'trains' if ok else 'does not fit'}")
        if ok:
            fits, params = layers, ok[0]["params"]
        else:
            fails = layers
        layers = layers * 2 if fails is None else (fits + fails) // 2
    if not fits:
        return {"mode": mode, "layers": 0, "params": 0, "tried": tried}
    return {"mode": mode, "layers": fits, "params": params, "tried": tried, "capped": fails is None}


def report(table: list, largest: list, a, info: dict) -> str:
    parts = [f"Machine: {common.machine_line(info)}; {common.load_line()} at the end of the run.",
             f"{a.nproc} processes (gloo on CPU); model: hidden {a.hidden}, {a.heads} heads, sequence {a.seq}, "
             f"vocabulary {a.vocab}, per-device batch {a.batch}, AdamW; the table: {a.layers} layers, {a.steps} steps.",
             ""]
    if any(parse_mode(m)[0] in ("stage2", "stage3") for m in common.split_list(a.modes)):
        parts += ["**stage2 / stage3 on this CPU build ran through the TEST-ONLY shim "
                  "`tests/parallel/cpu_sharding_shim.py`** (paddle's CPU guards of group_sharded bypassed; on a "
                  "GPU they run unshimmed).", ""]
    if any(parse_mode(m)[0] == "mp2" for m in common.split_list(a.modes)):
        parts += ["**mp2 (tensor parallel 2, models/ernie/parallel_model.py) on this CPU build ran through the TEST-ONLY "
                  "shim `tests/parallel/cpu_hybrid_shim.py`** (paddle's GPU-only all-reduce and c_identity replaced "
                  "by the same arithmetic); parameters: the whole model's, " + ", ".join(
                      f"{r['mode']} {r['ranks'][0]['params_per_rank']:,} per rank" for r in table
                      if parse_mode(r["mode"])[0] == "mp2") + ".", ""]
    if any(parse_mode(m)[0] == "pp2" for m in common.split_list(a.modes)):
        parts += ["**pp2 (pipeline parallel 2: the same network as a PipelineLayer, 2 micro-batches a step) on this "
                  "CPU build ran through the TEST-ONLY shim `tests/parallel/cpu_hybrid_shim.py`** (the device id and "
                  "gloo's send/recv in place of the calculation stream's); parameters: the whole model's, " + ", ".join(
                      f"{r['mode']} {' / '.join(format(x['params_per_rank'], ',') for x in r['ranks'])} per rank"
                      for r in table if parse_mode(r["mode"])[0] == "pp2") + ".", ""]
    if table:
        base = next((r for r in table if r["mode"] == "dp"), table[0])
        base_growth = max(x["peak_rss_mb"] - x["before_rss_mb"] for x in base["ranks"])
        base_step = max(x["step_s"] for x in base["ranks"])
        rows = []
        for r in table:
            growth = [x["peak_rss_mb"] - x["before_rss_mb"] for x in r["ranks"]]
            step = max(x["step_s"] for x in r["ranks"])
            rows.append([r["mode"], f"{r['ranks'][0]['params']:,}",
                         " / ".join(common.fmt(x["peak_rss_mb"], 0) for x in r["ranks"]),
                         " / ".join(common.fmt(g, 0) for g in growth),
                         common.fmt(max(growth) / base_growth, 2), common.fmt(1e3 * step, 1),
                         common.fmt(step / base_step, 2), common.fmt(r["ranks"][0]["loss"], 4)])
        parts += ["### Peak memory per rank and step time", "",
                  common.markdown_table(["mode", "parameters", "peak RSS per rank (MiB)",
                                         "growth over the pre-model RSS per rank (MiB)", "growth / dp",
                                         "step (ms, slowest rank, median)", "step / dp", "last loss"], rows), ""]
    if largest:
        base = next((r for r in largest if r["mode"] == "dp"), largest[0])
        rows = [[r["mode"], r["layers"], f"{r['params']:,}",
                 common.fmt(r["params"] / base["params"], 2) if base["params"] else "n/a",
                 ", ".join(f"{n}{'✓' if ok else '✗'}" for n, ok in r["tried"]) + (" (cap)" if r.get("capped") else "")]
                for r in largest]
        parts += [f"### The largest model that trains under {a.limit_mib} MiB of address space per rank "
                  f"(RLIMIT_AS above the pre-model address space; {a.probe_steps} steps)", "",
                  common.markdown_table(["mode", "layers", "parameters", "ratio to dp", "probes (layers)"], rows), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = common.Parser(prog="python -m benchmarks memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES) + " (default: all; on a CPU build "
                   "the stage 2/3, tensor and pipeline modes run through the tests' CPU shims, tests/parallel/cpu_*_shim.py)")
    p.add_argument("--full", action="store_true", help="ERNIE base: hidden 768, 12 layers, 12 heads, sequence 128")
    p.add_argument("--hidden", type=int, default=256, help="the ERNIE-style model's hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="its layers (default 4)")
    p.add_argument("--heads", type=int, default=4, help="its attention heads (default 4)")
    p.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    p.add_argument("--vocab", type=int, default=4000, help="vocabulary size (default 4000)")
    p.add_argument("--batch", type=int, default=4, help="per-device batch (default 4)")
    p.add_argument("--steps", type=int, default=5, help="steps per table run (default 5)")
    p.add_argument("--no-table", action="store_true", help="skip the table (with --find-largest)")
    p.add_argument("--find-largest", action="store_true", help="also search the largest model under --limit-mib")
    p.add_argument("--limit-mib", type=int, default=400, help="per-rank address space above the pre-model one, MiB (default 400)")
    p.add_argument("--start-layers", type=int, default=4, help="the search's first probe, layers (default 4)")
    p.add_argument("--max-layers", type=int, default=256, help="the search's cap, layers (default 256)")
    p.add_argument("--probe-steps", type=int, default=2, help="steps a probe trains (default 2)")
    p.add_argument("--precision", type=int, default=8, help="the search stops when the smallest size that failed exceeds the largest that "
                   "trained by at most 1/N of it (default 8)")
    p.add_argument("--probe-timeout", type=float, default=300, help="seconds a probe may take (default 300)")
    p.add_argument("--markdown", type=common.output_file, help="also write the report to this file")
    p.add_argument("--json", type=common.output_file, help="write the raw measurements to this file")
    memory_beside.add_arguments(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.full:
        a.hidden, a.layers, a.heads, a.seq = 768, 12, 12, 128
    if a.worker:
        worker(a)
        return 0
    if a.against_paddlenlp:
        return against_paddlenlp(a, sys.argv[1:] if argv is None else argv)
    modes = common.split_list(a.modes)
    for mode in modes:
        parse_mode(mode)
    info = common.machine_info()
    print(f"# memory: {a.nproc} processes; {common.machine_line(info)}", flush=True)
    start = time.time()
    table = [] if a.no_table else [{"mode": m, "ranks": launch(a, m, a.layers)} for m in modes]
    largest = []
    if a.find_largest:
        for mode in modes:
            largest.append(find_largest(a, mode, lambda line: print(line, flush=True)))
    text = report(table, largest, a, info) + f"\nWall time {time.time() - start:.0f} s.\n"
    print(text)
    common.write_outputs(text, {"machine": info, "table": table, "largest": largest, "options": vars(a)},
                         a.markdown, a.json)
    return 0


def against_paddlenlp(a, argv) -> int:
    memory_beside.beside_defaults(a, [arg.split("=")[0] for arg in argv])
    info = common.machine_info()
    print(f"# memory beside PaddleNLP's Trainer: {a.nproc} processes; {common.machine_line(info)}", flush=True)
    start = time.time()
    result = memory_beside.measure(a, lambda line: print(line, flush=True))
    text = (f"Machine: {common.machine_line(info)}; {common.load_line()} at the end of the run.\n\n"
            + memory_beside.report(result, a) + f"\nWall time {time.time() - start:.0f} s.\n")
    print(text)
    common.write_outputs(text, {"machine": info, **result, "options": vars(a)}, a.markdown, a.json)
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(main())
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["memory", *sys.argv[1:]]))
