"""One model as the server serves it: its name and version, its predictor processes and batcher, its metadata.

The name is ``--model_name``, else the task the export names (``task.json`` /
``preprocess.json``), else the export directory's name (its parent's for an
``inference/`` directory: ``runs/digits-demo/inference`` is ``digits-demo``).
Output names are ``--output_names``, else the keys of a model that returns a
dict (``export.json``), else the task's (``logits`` for the project's
classifiers), else ``output`` (``output_0``, ``output_1``, ... for several):
never paddle's ``fetch_name_0``.
"""

from __future__ import annotations

import json
import os
import re
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ConfigError, DataError
from .oip import tensor_metadata
from .predictor import export_task, model_files

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def default_model_name(model_dir: str, task: Optional[str] = None) -> str:
    if task:
        return task
    path = os.path.abspath(model_dir).rstrip(os.sep)
    base = os.path.basename(path)
    if base == "inference" and os.path.basename(os.path.dirname(path)):
        base = os.path.basename(os.path.dirname(path))
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", base).lstrip("-._") or "model"
    return cleaned[:128]


def check_name(flag: str, value: str) -> str:
    if not NAME.fullmatch(value):
        raise ConfigError(f"{flag} {value!r} is not allowed: give letters, digits, '_', '.', '-' (at most 128, "
                          "starting with a letter or digit): it is part of the URL")
    return value


NAME_RULE = ("a model's name is letters, digits, '_', '.', '-' (at most 128, starting with a letter or digit), as "
             "--model_name: it is part of the URL")


def find_models(entries: Union[str, Sequence[str]], prefix: Optional[str] = None, name: Optional[str] = None,
                version: str = "1") -> Tuple[List[Tuple[str, str, str]], List[Tuple[str, str]]]:
    """``([(name, version, directory)], [(folder, reason)])``: what ``ptrain serve DIR [DIR...]`` serves, and the
    folders of its model repositories it does not serve, with the reason.

    Each entry is an export directory, ``NAME=DIR``, or a model repository (as
    Triton's): a folder whose sub-folders are exports (named by the sub-folder)
    or hold numbered version folders (the highest is served, as its version).
    A sub-folder whose name breaks :data:`NAME` (``my model``, ``modèle``) or
    that holds no export is not served: it is listed with its reason.
    """
    entries = [entries] if isinstance(entries, str) else list(entries)
    if name is not None and len(entries) != 1:
        raise ConfigError("--model_name names one model: with several, give NAME=DIR for each")
    found: List[Tuple[str, str, str]] = []
    skipped: List[Tuple[str, str]] = []
    for entry in entries:
        given, _, path = entry.partition("=") if "=" in entry and not os.path.isdir(entry) else ("", "", entry)
        if not os.path.isdir(path):
            raise ConfigError(f"MODEL_DIR {path} does not exist: give the directory of an exported model "
                              "(OUTPUT_DIR/inference of a finished run) or a model repository")
        repo, left = ([], []) if _has_model(path) else _repository(path)
        if not repo:
            if left and not any(reason == NO_MODEL for _, reason in left):  # folders of models, none served
                raise ConfigError(f"model repository {path} holds no model this server can serve: "
                                  + skipped_line(left))
            model_files(path, prefix)  # DataError naming what is missing
            repo = [(check_name("--model_name", given or name or default_model_name(path, export_task(path))),
                     version, path)]
        elif given or name:
            raise ConfigError(f"{path} is a model repository ({len(repo)} models, named by their folders): "
                              "--model_name and NAME= name a single export")
        found += repo
        skipped += left
    names = [n for n, _, _ in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"several models are named {', '.join(twice)}: name them apart with NAME=DIR")
    return found, skipped


NO_MODEL = ("no exported model in it (PREFIX.json or PREFIX.pdmodel with PREFIX.pdiparams), nor in a numbered "
            "version folder")


def skipped_line(skipped: Sequence[Tuple[str, str]]) -> str:
    """The folders not served, grouped by reason: ``'my model', 'modèle' (a model's name is ...); 'notes' (no ...)``."""
    by_reason: dict = {}
    for folder, reason in skipped:
        by_reason.setdefault(reason, []).append(shown(folder))
    return "; ".join(", ".join(repr(f) for f in folders) + f" ({reason})" for reason, folders in by_reason.items())


def shown(folder: str) -> str:
    """A folder's name as text anything can print or encode (bytes that are not UTF-8 as backslash escapes)."""
    return folder.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _has_model(path: str) -> bool:
    try:
        model_files(path)
        return True
    except DataError:
        return False


def _repository(path: str) -> Tuple[List[Tuple[str, str, str]], List[Tuple[str, str]]]:
    """``(the models of a repository folder, [(sub-folder, why it is not served)])``."""
    out, skipped = [], []
    for sub in sorted(os.listdir(path)):
        folder = os.path.join(path, sub)
        if not os.path.isdir(folder):
            continue
        versions = sorted(int(v) for v in os.listdir(folder)
                          if v.isascii() and v.isdigit() and _has_model(os.path.join(folder, v)))
        if versions:
            served = (sub, str(versions[-1]), os.path.join(folder, str(versions[-1])))
        elif _has_model(folder):
            served = (sub, "1", folder)
        else:
            skipped.append((sub, NO_MODEL))
            continue
        if NAME.fullmatch(sub):
            out.append(served)
        else:
            skipped.append((sub, NAME_RULE))
    return out, skipped


def output_names(model_dir: str, fetch_names: Sequence[str], given: Optional[Sequence[str]] = None,
                 task_names: Optional[Sequence[str]] = None) -> List[str]:
    """The names the server gives the model's outputs (see the module docstring), in the runtime's order."""
    n = len(fetch_names)
    if given:
        if len(given) != n:
            raise ConfigError(f"--output_names {','.join(given)}: the model has {n} output(s)")
        return list(given)
    keys = _export_keys(model_dir, fetch_names)
    if keys and all(k and not k.isdigit() for k in keys) and len(set(keys)) == n:
        return keys
    if task_names and len(task_names) == n:
        return list(task_names)
    return ["output"] if n == 1 else [f"output_{i}" for i in range(n)]


def _export_keys(model_dir: str, fetch_names: Sequence[str]) -> List[str]:
    try:
        with open(os.path.join(model_dir, "export.json"), encoding="utf-8") as f:
            outputs = {o["name"]: str(o.get("key", "")) for o in json.load(f).get("outputs", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [outputs.get(n, "") for n in fetch_names]


class ServedModel:
    """A model behind the server: ``pool`` (its predictor processes), ``batcher`` (its queue), its names."""

    def __init__(self, name: str, version: str, model_dir: str, pool, batcher, platform: str, preprocessing=None,
                 output_names_given: Optional[Sequence[str]] = None, task_output_names: Optional[Sequence[str]] = None):
        self.name, self.version, self.model_dir = name, version, model_dir
        self.pool, self.batcher, self.platform = pool, batcher, platform
        self.inline = None  # the model loaded in the server process too, for lone requests (placement)
        self.preprocessing = preprocessing
        self._given, self._task_names = output_names_given, task_output_names
        self.outputs: List[str] = []     # set by bind() once a predictor has loaded the model
        self.output_specs: List[dict] = []

    def bind(self) -> None:
        """Name the outputs from the first loaded predictor's spec (ConfigError if ``--output_names`` misfits)."""
        spec = self.pool.spec
        self.outputs = output_names(self.model_dir, spec["outputs"], self._given, self._task_names)
        seen = spec.get("output_specs") or [{}] * len(self.outputs)  # from the predictor's warm-up run
        self.output_specs = [tensor_metadata(mine, s.get("dtype", "float32"), s.get("shape"))
                             for mine, s in zip(self.outputs, seen)]

    @property
    def loaded(self) -> bool:
        return self.pool.spec is not None and bool(self.outputs)

    @property
    def ready(self) -> bool:
        return self.loaded and self.pool.ready

    def named(self, outputs: Sequence[np.ndarray]) -> dict:
        return dict(zip(self.outputs, outputs))

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": self.platform,
                "inputs": [tensor_metadata(s["name"], s["dtype"], s.get("shape")) for s in self.pool.spec["inputs"]],
                "outputs": self.output_specs}

