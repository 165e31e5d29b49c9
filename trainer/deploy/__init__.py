"""Deployment: from a trained model to something that answers.

Owns: exporting an inference model with ``paddle.jit.save`` and proving it
matches the trained one (``export``), loading an export into a
``paddle.inference`` predictor and running it (``predictor``), converting it
to ONNX and checking it against onnxruntime (``onnx_export``), and serving it
over HTTP (``ptrain serve``): the server's start and drain (``server``), the
routes (``http_app``: ``/v1`` and the Open Inference Protocol v2; ``grpc_app``: the
v2 protocol over gRPC), request checks (``payload``, and ``oip`` for v2 bodies), a
served model's names, metadata and the model repository (``served``), client
connections' timeouts and limit (``connections``), a request's body framed one way
(``framing``), the decode budget (``limits``), dynamic batching
(``batching``), the predictor processes (``pool`` on the server's side,
``worker`` inside them), a model run in the server process (``inline``) and
when the default runs lone requests there (``placement``), the runtimes they load
(``runtimes``) and the Prometheus metrics (``metrics``).

May import: the package's version (``trainer``) and the loop's lower modules
(``trainer.errors``, ``trainer.distributed``, ``trainer.tensors``, ``trainer.process``);
never the loop, checkpoints, the launcher, the commands or models. An export asks the
trainer's Layout for the whole model it writes, whatever the layout (``Layout.whole_model``).

A task's preprocessing reaches the server as an argument (``trainer.task.Preprocessing``),
resolved by ``ptrain serve``.

Used by: ``Trainer.export()``, ``callbacks.Export``, the tasks' ``predict``
(``models.*``), ``ptrain predict`` and ``ptrain serve``.
"""
