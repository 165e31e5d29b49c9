"""setup.cfg's two environments stay installable and CI tests the one the docs show: PaddleNLP's (cpu / gpu pull in
the paddlenlp extra) and PaddleFormers' (the paddleformers extra), which cannot share one environment.
tests/paddleformers/test_environment.py checks the second from inside it."""

import configparser
import os
import re

from helpers import REPO


def _cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return cfg


def _pins(text: str) -> dict:
    """name -> the requirement line, for each requirement of a setup.cfg list."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return {re.match(r"[A-Za-z0-9._-]+", line).group(0).lower().replace("_", "-"): line for line in lines}


def test_the_shared_stack_pins_nothing_either_environment_pins_otherwise():
    cfg = _cfg()
    shared = _pins(cfg["options"]["install_requires"])
    extras = cfg["options.extras_require"]
    nlp, formers = _pins(extras["paddlenlp"]), _pins(extras["paddleformers"])
    assert "paddlenlp" in nlp and "paddleformers" in formers and "paddlenlp" not in formers
    assert "paddlenlp" not in shared and "paddleformers" not in shared and "numpy" not in shared
    for name, line in shared.items():  # an exact pin here would have to be the same in both sets
        if "==" in line:
            assert name not in nlp and name not in formers, f"{name} is pinned in install_requires and an extra"
    # the default the README installs (.[cpu]) and the GPU extra bring paddlenlp; nothing else does
    pulls = {name for name in extras if "paddle-trainer[paddlenlp]" in extras[name]}
    assert pulls == {"cpu", "gpu"}, pulls
    assert not any("paddle-trainer[" in extras[name] for name in ("paddleformers", "test", "docs"))


def test_ci_makes_the_paddleformers_environment_the_docs_show():
    page = open(os.path.join(REPO, "docs", "getting-started.md"), encoding="utf-8").read()
    command = re.search(r'^pip install -e "\.\[paddleformers,test\]"[^\n&]*', page, re.M).group(0).strip()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    venv = re.search(r"python -m venv --clear (\S+)", ci).group(1)
    assert f"{venv}/bin/python -m {command}" in ci  # in a venv of its own, after the main suite
    assert f"{venv}/bin/python -m pip check" in ci and f"{venv}/bin/python -m pytest tests/paddleformers" in ci
    assert ci.index("python -m pytest\n") < ci.index(venv)
    with open(os.path.join(REPO, ".gitignore"), encoding="utf-8") as f:
        assert venv + "/" in f.read().split()
