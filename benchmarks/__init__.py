"""Side-by-side benchmarks: ``python -m benchmarks NAME [options]``.

=========  =====================================================================
overhead   per-step cost of our Trainer against a hand-written loop, PaddleNLP's
           Trainer and ``paddle.Model.fit`` (MLP, small ERNIE, ResNet-50)
allreduce  all-reduce time and bus bandwidth from 1 KiB to 256 MiB across the
           processes of a ``paddle.distributed.launch`` run, and the share of a
           training step spent in gradient synchronization
dataloader images/s of the ResNet input pipeline against
           ``dataloader_num_workers``, and the data-wait share of a training step
workers    CPU and wall time per epoch with DataLoader workers kept across
           epochs and evaluations against new workers every pass
checkpoint the training stall of a checkpoint save (sync and async) and the
           cost of resuming (``benchmarks/checkpoint.py``)
serve      ``ptrain serve`` under a closed-loop load on loopback: requests/s and
           p50/p99 latency with and without dynamic batching
memory     peak memory per rank and step time of data parallel, sharding stages
           1/2/3, each with recompute; the largest model under a memory limit
=========  =====================================================================

Each runs with a short default (a few minutes on 2 CPU cores); ``--help``
lists the options. Results measured here are in ``benchmarks/RESULTS.md``.
These are benchmarks, not tests: ``tests/benchmarks/test_smoke.py`` only
checks, in seconds, that each still runs.
"""

BENCHMARKS = {
    "overhead": "benchmarks.overhead",
    "allreduce": "benchmarks.allreduce",
    "dataloader": "benchmarks.dataloader",
    "checkpoint": "benchmarks.checkpoint",
    "workers": "benchmarks.workers",
    "serve": "benchmarks.serve",
    "memory": "benchmarks.memory",
}
