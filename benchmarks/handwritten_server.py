"""The server a Paddle user writes by hand today: Starlette + ``paddle.inference`` in the handler, under uvicorn.

The peer ``benchmarks/serve.py`` measures ``ptrain serve`` against: one process, one predictor created at start
(one math thread, as ``ptrain serve``'s predictor processes), one request per model call, no batching, no queue.

    python -m benchmarks.handwritten_server MODEL_DIR PORT [GRPC_PORT]   # prints "ready on http://127.0.0.1:PORT"

``POST /predict {"inputs": [[...], ...]}`` answers ``{"outputs": [[...], ...]}`` (the first output). With
``GRPC_PORT``, the same predictor also answers ``ModelInfer`` of the Open Inference Protocol's gRPC service
(``grpc.aio`` in the same event loop, tritonclient's compiled messages): the first input's raw bytes in, the
first output's raw bytes out, no checks: the gRPC server a user writes by hand, the peer of ``ptrain serve
--grpc_port``.
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

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"])])
    app.state.predictor = predictor
    return app


def grpc_server(predictor, port: int):
    """A ``grpc.aio`` server answering ``ModelInfer`` with ``predictor`` (not started)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pb_grpc

    name = predictor.get_input_names()[0]
    handle, out = predictor.get_input_handle(name), predictor.get_output_handle(predictor.get_output_names()[0])

    class Service(pb_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request, context):
            x = np.frombuffer(request.raw_input_contents[0], dtype="<f4").reshape(list(request.inputs[0].shape))
            handle.reshape(list(x.shape))
            handle.copy_from_cpu(x)
            predictor.run()
            y = out.copy_to_cpu()
            answer = pb.ModelInferResponse(model_name=request.model_name)
            answer.outputs.add(name="y", datatype="FP32", shape=list(y.shape))
            answer.raw_output_contents.append(y.astype("<f4").tobytes())
            return answer

    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    return server


def main(argv=None) -> int:
    import asyncio

    import uvicorn

    args = (argv or sys.argv[1:])
    model_dir, port = args[:2]
    app = build(model_dir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as ptrain serve
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(port)))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    async def serve() -> None:
        rpc = grpc_server(app.state.predictor, int(args[2])) if len(args) > 2 else None
        if rpc is not None:
            await rpc.start()
        print(f"ready on http://127.0.0.1:{sock.getsockname()[1]} ", flush=True)
        await server.serve(sockets=[sock])
        if rpc is not None:
            await rpc.stop(0)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
