"""``ptrain serve MODEL_DIR``: its flags and the command (the server is ``trainer.deploy.server``).

The command resolves what the server cannot know by itself: the task an
export came from (``task.json`` / ``preprocess.json`` next to the model name
it), whose ``preprocessing`` (``trainer.task.Task``) answers
``{"images": [...]}`` / ``{"texts": [...]}``; and, for ``--runtime
onnxruntime``, converts and checks ``model.onnx`` first when it is missing or
older than the export (``trainer.deploy.onnx_export``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import pip_extra
from ..process import startup_handlers_active

#: the install hint, word for word as docs/how-to/serve.md gives it (tests/docs/test_first_hour_docs.py)
SERVE_EXTRA = pip_extra("serve")


def add_serve_parser(sub) -> argparse.ArgumentParser:
    srv = sub.add_parser("serve", help="serve exported models over HTTP (/v1 and the Open Inference Protocol v2), with "
                                       "dynamic batching (docs/how-to/serve.md)",
                         description="Serve the paddle.jit.save model in MODEL_DIR (OUTPUT_DIR/inference of a run, or "
                                     "any *.json + *.pdiparams; several: DIR DIR, NAME=DIR, or a model repository "
                                     "folder) over HTTP: POST /v1/predict {\"inputs\": [...]}, the Open Inference "
                                     "Protocol (KServe v2, Triton's HTTP API: POST /v2/models/NAME/infer, JSON or "
                                     "binary tensors), GET /health, /ready, /v2/health/ready, /metrics. Requests wait "
                                     "at most --max_delay_ms to share a model call of up to --max_batch_size "
                                     "instances, run in --workers predictor processes per model. SIGTERM/SIGINT: "
                                     "new requests get 503, the accepted ones are answered, exit 0.")
    srv.add_argument("model_dir", metavar="MODEL_DIR", nargs="+",
                     help="directory of an exported model; NAME=DIR to name it; several; or a model repository folder "
                          "(NAME/ or NAME/VERSION/ sub-folders)")
    srv.add_argument("--model_prefix", default=None, help="PREFIX of PREFIX.json/.pdiparams when MODEL_DIR holds several")
    srv.add_argument("--model_name", default=None,
                     help="the model's name in /v2/models/NAME (default: the task the export names, else the export "
                          "directory's name, its parent's for .../inference)")
    srv.add_argument("--model_version", default="1", help="the model's version in /v2 (default 1)")
    srv.add_argument("--output_names", default=None,
                     help="comma-separated names of the model's outputs (default: the dict keys a model returns, the "
                          "task's names such as logits, else output / output_K)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port, printed when ready)")
    srv.add_argument("--grpc_port", type=int, default=0,
                     help="also serve the Open Inference Protocol over gRPC (KServe v2, Triton's "
                          "inference.GRPCInferenceService) on this port of --host (default 0: off)")
    srv.add_argument("--max_batch_size", type=int, default=32, help="instances per model call, and per request (default 32)")
    srv.add_argument("--max_delay_ms", type=float, default=5.0,
                     help="longest a request waits for others to batch with, under load (default 5; a request "
                          "alone runs at once)")
    srv.add_argument("--max_queue", type=int, default=None,
                     help="requests waiting per model before 503 + Retry-After (default 16 x max_batch_size x workers)")
    srv.add_argument("--workers", type=int, default=None,
                     help="predictor processes per model (default 1; a model whose call on a full batch takes under "
                          "--inline_max_ms also runs lone requests in the server process); 0: run every request in "
                          "the server process (no process hop; the server waits while it runs, no crash isolation, "
                          "no batching)")
    srv.add_argument("--inline_max_ms", type=float, default=1.0,
                     help="without --workers, a CPU model whose warm call on --max_batch_size rows takes under this "
                          "many ms also runs lone requests in the server process (default 1; 0: never)")
    srv.add_argument("--threads", type=int, default=1, help="CPU math threads per predictor process (default 1)")
    srv.add_argument("--device", default="cpu", help="cpu or gpu:K (default cpu)")
    srv.add_argument("--runtime", default="paddle", choices=["paddle", "onnxruntime"],
                     help="paddle.inference (default) or onnxruntime (model.onnx, converted and checked when missing)")
    srv.add_argument("--max_body_bytes", type=int, default=16 << 20, help="larger bodies get 413 (default 16 MiB)")
    srv.add_argument("--allow_nonfinite", action="store_true",
                     help="pass NaN and infinities in float inputs to the model (default: 400 naming the value)")
    srv.add_argument("--max_image_pixels", type=int, default=40_000_000,
                     help="decoded pixels per image of an image task (default 40 M); larger images get 413")
    srv.add_argument("--max_decode_pixels", type=int, default=None,
                     help="pixels decoded at once over all requests (default 2 x --max_image_pixels); others wait")
    srv.add_argument("--header_timeout", type=float, default=10.0,
                     help="seconds for a request's line and headers to arrive (default 10); then 408 and closed")
    srv.add_argument("--body_timeout", type=float, default=30.0,
                     help="seconds for a request's body to arrive after its headers (default 30); then 408 and closed")
    srv.add_argument("--max_connections", type=int, default=None,
                     help="open connections (default: the open-file limit less a reserve for accepting, at most "
                          "8192); at the limit a new connection closes the oldest one still waiting for its headers")
    srv.add_argument("--drain_timeout", type=float, default=30.0,
                     help="seconds from SIGTERM/SIGINT to exit: answer accepted requests, refuse new ones (default 30)")
    srv.add_argument("--start_timeout", type=float, default=300.0,
                     help="seconds for a predictor process to load and warm up the model (default 300)")
    srv.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    return srv


def _task_of(model_dir: str):
    """``(Preprocessing or None, output names or None)`` of the task the export in ``model_dir`` names."""
    from ..deploy.predictor import export_task
    from .tasks import available_tasks, get_task, missing_extra

    task_name = export_task(model_dir)
    if task_name is None:
        return None, None
    tasks = available_tasks()
    missing = "is not installed" if task_name not in tasks else missing_extra(tasks[task_name])
    if missing:  # not installed, or its extra is not (ernie in a PaddleFormers environment): raw inputs only
        print(f"ptrain serve: {model_dir} names task {task_name}, which {missing}: only "
              '{"inputs": [...]} is served', file=sys.stderr)
        return None, None
    task = get_task(task_name)
    pre = task.preprocessing(model_dir) if task.preprocessing is not None else None
    return pre, getattr(task, "output_names", None)


def cmd_serve(ns) -> int:
    from ..errors import ConfigError

    for module in ("uvicorn", "starlette", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"ptrain serve needs {module}: {SERVE_EXTRA}") from None
    from ..deploy.server import ServeConfig, serve

    names = [n.strip() for n in ns.output_names.split(",")] if ns.output_names else None
    config = ServeConfig(ns.model_dir, ns.model_prefix, ns.host, ns.port, ns.max_batch_size, ns.max_delay_ms,
                         ns.max_queue, ns.workers, ns.device, ns.runtime, ns.threads, ns.max_body_bytes,
                         ns.drain_timeout, ns.start_timeout, model_name=ns.model_name, model_version=ns.model_version,
                         output_names=names, allow_nonfinite=ns.allow_nonfinite, header_timeout=ns.header_timeout,
                         body_timeout=ns.body_timeout, max_connections=ns.max_connections,
                         max_image_pixels=ns.max_image_pixels, max_decode_pixels=ns.max_decode_pixels,
                         inline_max_ms=ns.inline_max_ms, grpc_port=ns.grpc_port).check()
    if ns.runtime == "onnxruntime":
        from ..deploy.onnx_export import export_onnx, is_current

        for _, _, model_dir in config.models:
            if not is_current(model_dir, ns.model_prefix):
                report = export_onnx(model_dir, ns.model_prefix)
                print(f"ptrain serve: converted to {report['onnx_file']} (paddle2onnx {report['paddle2onnx']}, opset "
                      f"{report['opset']}); onnxruntime matches paddle.inference within {report['max_abs_diff']:.3g} "
                      f"(max abs diff, atol {report['atol']:g})", file=sys.stderr, flush=True)
    startup_handlers_active(False)  # the server owns SIGTERM/SIGINT from here: it drains
    code = serve(config, tasks=_task_of)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the report is out and the predictors are stopped: tearing paddle down would only outlast
    #                 --drain_timeout
