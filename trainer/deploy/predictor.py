"""Loading an exported inference model: its files, a ``paddle.inference`` predictor, and one run of it.

::

    predictor = create_predictor("runs/digits/inference")
    (logits,) = run_predictor(predictor, [features])
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional, Sequence

import numpy as np

from ..errors import DataError

PREFIX = "model"
MODEL_FILES = (PREFIX + ".json", PREFIX + ".pdmodel")  # PIR (paddle 3 default), legacy program IR
PARAMS_FILE = PREFIX + ".pdiparams"


def _prefixes(path: str) -> List[str]:
    """The prefixes of the complete exports in ``path`` (``P.json`` or ``P.pdmodel`` beside ``P.pdiparams``)."""
    found = set()
    for name in os.listdir(path):
        for ext in (".json", ".pdmodel"):
            if name.endswith(ext) and os.path.isfile(os.path.join(path, name[:-len(ext)] + ".pdiparams")):
                found.add(name[:-len(ext)])
    return sorted(found)


def model_files(path: str, prefix: Optional[str] = None) -> tuple:
    """``(model_file, params_file)`` of the export in directory ``path``.

    ``prefix`` None: ``model`` (what this project exports) when present, else
    the one ``PREFIX.json``/``PREFIX.pdmodel`` + ``PREFIX.pdiparams`` pair the
    directory holds (any ``paddle.jit.save`` prefix); several pairs need a prefix.
    """
    if not os.path.isdir(path):
        raise DataError(f"{path} is not a directory: give the directory of an exported inference model")
    if prefix is None and not any(os.path.isfile(os.path.join(path, n)) for n in MODEL_FILES):
        found = _prefixes(path)
        if len(found) > 1:
            raise DataError(f"{path} holds several inference models ({', '.join(found)}): name one with "
                            "--model_prefix (Python: prefix=...)")
        prefix = found[0] if found else PREFIX
    prefix = prefix or PREFIX
    for name in (prefix + ".json", prefix + ".pdmodel"):
        model_file = os.path.join(path, name)
        if os.path.isfile(model_file):
            params_file = os.path.join(path, prefix + ".pdiparams")
            if not os.path.isfile(params_file):
                raise DataError(f"{path} has {name} but no {prefix}.pdiparams: the export is incomplete, export again")
            return model_file, params_file
    if prefix != PREFIX:
        raise DataError(f"{path} holds no inference model {prefix}.json or {prefix}.pdmodel (with {prefix}.pdiparams): "
                        f"give a --model_prefix it has ({', '.join(_prefixes(path)) or 'none'})")
    raise DataError(f"{path} holds no inference model ({' or '.join(MODEL_FILES)}): give the directory "
                    "Trainer.export() or callbacks.Export wrote (output_dir/inference)")


def fingerprint(path: str, prefix: Optional[str] = None) -> str:
    """``sha256:<hex>`` of the export's program and weights (what a predictor loads), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    for file in model_files(path, prefix):
        with open(file, "rb") as f:
            digest.update(os.path.basename(file).encode() + b"\0")
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def files_state(path: str, prefix: Optional[str] = None) -> tuple:
    """``(size, mtime_ns, inode)`` of each model file: compared before and after a load to see a change during it."""
    return tuple((s.st_size, s.st_mtime_ns, s.st_ino) for s in map(os.stat, model_files(path, prefix)))


TASK_FILES = ("task.json", "preprocess.json")  # written next to the model by a task's export (ernie, resnet)


def export_task(path: str) -> Optional[str]:
    """The task an export directory says it came from (``"task"`` in ``task.json`` or ``preprocess.json``), or None."""
    for name in TASK_FILES:
        file = os.path.join(path, name)
        if os.path.isfile(file):
            try:
                with open(file, encoding="utf-8") as f:
                    task = json.load(f).get("task")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(task, str) and task:
                return task
    return None


def input_spec(path: str, prefix: Optional[str] = None) -> List[dict]:
    """``[{"name", "shape" (-1 dynamic), "dtype"}]`` of the export's inputs, in feed order when known.

    From ``export.json`` (this project's exports), else the ``data`` ops of a
    PIR program (``*.json``); an empty list when neither says (a legacy
    ``*.pdmodel`` without ``export.json``): the runtime then checks alone.
    """
    model_file, _ = model_files(path, prefix)
    report = os.path.join(path, "export.json")
    if os.path.basename(model_file).startswith(PREFIX + ".") and os.path.isfile(report):
        with open(report, encoding="utf-8") as f:
            return [{"name": i["name"], "shape": [int(d) for d in i["shape"]], "dtype": i["dtype"]}
                    for i in json.load(f).get("inputs", [])]
    if not model_file.endswith(".json"):
        return []
    with open(model_file, encoding="utf-8") as f:
        program = json.load(f)
    specs = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("#") == "1.data":
                attrs = {a.get("N"): a.get("AT", {}).get("D") for a in node.get("A", []) if isinstance(a, dict)}
                specs.append({"name": attrs.get("name"), "shape": [int(d) for d in attrs.get("shape") or []],
                              "dtype": str(attrs.get("dtype"))})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(program.get("program", {}))
    return specs


#: input shapes whose oneDNN primitives a CPU predictor keeps. paddle's default, 0, keeps none: a call whose batch
#: size differs from the last one's builds every primitive again. A server's batches vary in size (1 to
#: --max_batch_size), and on a 34 M-parameter MLP a stream of batch sizes 1-32 cost 71.6 ms a call against 10.8
#: with the shapes kept (12.9 / 9.7 ms at a constant 15 rows); ERNIE's sequence lengths vary the same way.
#: The price: the kept primitives' memory, per shape
SHAPE_CACHE = 64


def create_predictor(path: str, device: str = "cpu", threads: int = 1, prefix: Optional[str] = None):
    """A ``paddle.inference`` predictor for the export in ``path`` (device ``cpu`` or ``gpu:N``)."""
    import paddle.inference as paddle_infer

    model_file, params_file = model_files(path, prefix)
    config = paddle_infer.Config(model_file, params_file)
    if device.startswith("gpu"):
        config.enable_use_gpu(256, int(device.partition(":")[2] or 0))
    else:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(threads)
        config.set_mkldnn_cache_capacity(SHAPE_CACHE)
    config.disable_glog_info()
    return paddle_infer.create_predictor(config)


def run_predictor(predictor, inputs: Sequence[np.ndarray], names: Optional[Sequence[str]] = None) -> List[np.ndarray]:
    """Feed ``inputs`` (matched by ``names``, else in the predictor's input order); return every output."""
    feed_names = list(predictor.get_input_names())
    names = list(names) if names is not None else feed_names[:len(inputs)]
    if len(inputs) != len(feed_names) or sorted(names) != sorted(feed_names):
        raise DataError(f"the inference model takes inputs {feed_names}, got {len(inputs)} named {names}")
    for name, value in zip(names, inputs):
        value = np.ascontiguousarray(value)
        handle = predictor.get_input_handle(name)
        handle.reshape(list(value.shape))
        handle.copy_from_cpu(value)
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]
