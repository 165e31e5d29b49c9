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
import sys

from ..process import startup_handlers_active

#: the install hint, word for word as docs/how-to/serve.md gives it (tests/docs/test_first_hour_docs.py)
SERVE_EXTRA = 'pip install -e ".[serve]" in the paddle-trainer checkout'


def add_serve_parser(sub) -> argparse.ArgumentParser:
    srv = sub.add_parser("serve", help="serve an exported model over HTTP, with dynamic batching (docs/how-to/serve.md)",
                         description="Serve the paddle.jit.save model in MODEL_DIR (OUTPUT_DIR/inference of a run, or "
                                     "any *.json + *.pdiparams) over HTTP: POST /v1/predict {\"inputs\": [...]}, GET "
                                     "/health, /ready, /metrics. Requests wait at most --max_delay_ms to share a model "
                                     "call of up to --max_batch_size instances, run in --workers predictor processes. "
                                     "SIGTERM/SIGINT: stop accepting, answer what was accepted, exit 0.")
    srv.add_argument("model_dir", metavar="MODEL_DIR", help="directory of the exported model")
    srv.add_argument("--model_prefix", default=None, help="PREFIX of PREFIX.json/.pdiparams when MODEL_DIR holds several")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port, printed when ready)")
    srv.add_argument("--max_batch_size", type=int, default=32, help="instances per model call, and per request (default 32)")
    srv.add_argument("--max_delay_ms", type=float, default=5.0,
                     help="longest a request waits for others to batch with (default 5)")
    srv.add_argument("--max_queue", type=int, default=None,
                     help="requests waiting before 503 + Retry-After (default 16 x max_batch_size x workers)")
    srv.add_argument("--workers", type=int, default=1, help="predictor processes (default 1)")
    srv.add_argument("--threads", type=int, default=1, help="CPU math threads per predictor process (default 1)")
    srv.add_argument("--device", default="cpu", help="cpu or gpu:K (default cpu)")
    srv.add_argument("--runtime", default="paddle", choices=["paddle", "onnxruntime"],
                     help="paddle.inference (default) or onnxruntime (model.onnx, converted and checked when missing)")
    srv.add_argument("--max_body_bytes", type=int, default=16 << 20, help="larger bodies get 413 (default 16 MiB)")
    srv.add_argument("--drain_timeout", type=float, default=30.0,
                     help="seconds to answer accepted requests after SIGTERM/SIGINT (default 30)")
    srv.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    return srv


def cmd_serve(ns) -> int:
    from ..errors import ConfigError

    for module in ("uvicorn", "starlette", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"ptrain serve needs {module}: {SERVE_EXTRA}") from None
    from ..deploy.predictor import export_task
    from ..deploy.server import ServeConfig, serve

    config = ServeConfig(ns.model_dir, ns.model_prefix, ns.host, ns.port, ns.max_batch_size, ns.max_delay_ms,
                         ns.max_queue, ns.workers, ns.device, ns.runtime, ns.threads, ns.max_body_bytes,
                         ns.drain_timeout).check()
    preprocessing = None
    task_name = export_task(ns.model_dir)
    if task_name is not None:
        from .tasks import available_tasks, get_task

        if task_name in available_tasks():
            task = get_task(task_name)
            if task.preprocessing is not None:
                preprocessing = task.preprocessing(ns.model_dir)
        else:
            print(f"ptrain serve: the export names task {task_name}, which is not installed: only "
                  '{"inputs": [...]} is served', file=sys.stderr)
    if ns.runtime == "onnxruntime":
        from ..deploy.onnx_export import export_onnx, is_current

        if not is_current(ns.model_dir, ns.model_prefix):
            report = export_onnx(ns.model_dir, ns.model_prefix)
            print(f"ptrain serve: converted to {report['onnx_file']} (paddle2onnx {report['paddle2onnx']}, opset "
                  f"{report['opset']}); onnxruntime matches paddle.inference within {report['max_abs_diff']:.3g} "
                  f"(max abs diff, atol {report['atol']:g})", file=sys.stderr, flush=True)
    startup_handlers_active(False)  # the server owns SIGTERM/SIGINT from here: it drains
    return serve(config, preprocessing)
