"""The server a Paddle user writes by hand today: Starlette + ``paddle.inference`` in the handler, under uvicorn.

The peer ``benchmarks/serve.py`` measures ``ptrain serve`` against: one process, one predictor created at start
(one math thread, as ``ptrain serve``'s predictor processes), one request per model call, no batching, no queue.

    python -m benchmarks.handwritten_server MODEL_DIR PORT   # prints "ready on http://127.0.0.1:PORT"

``POST /predict {"inputs": [[...], ...]}`` answers ``{"outputs": [[...], ...]}`` (the first output).
"""

from __future__ import annotations

import json
import socket
import sys

import numpy as np


def build(model_dir: str):
    import paddle.inference as paddle_infer
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    config = paddle_infer.Config(f"{model_dir}/model.json", f"{model_dir}/model.pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(1)
    config.disable_glog_info()
    predictor = paddle_infer.create_predictor(config)
    name = predictor.get_input_names()[0]
    handle, out = predictor.get_input_handle(name), predictor.get_output_handle(predictor.get_output_names()[0])

    async def predict(request):
        x = np.asarray(json.loads(await request.body())["inputs"], dtype="float32")
        handle.reshape(list(x.shape))
        handle.copy_from_cpu(x)
        predictor.run()
        return Response(json.dumps({"outputs": out.copy_to_cpu().tolist()}), media_type="application/json")

    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


def main(argv=None) -> int:
    import uvicorn

    model_dir, port = (argv or sys.argv[1:])[:2]
    app = build(model_dir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as ptrain serve
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(port)))
    print(f"ready on http://127.0.0.1:{sock.getsockname()[1]} ", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
