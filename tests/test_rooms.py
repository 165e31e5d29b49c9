"""The room rules of docs/explanation/architecture.md hold for the code as it is (tests/rooms.py reads it):
no circle of modules, counting imports inside functions; arrows between rooms run down only; each room's
``May import:`` list is exactly what its modules import; trainer/ keeps at most 20 modules at its top and no
module of the house grows past 700 lines. A failure names the file, the line and the import."""

import ast
import os
import re
import textwrap

import pytest
from helpers import REPO
from rooms import House, describe

HOUSE = House(REPO)
MAX_TOP_LEVEL_MODULES = 20
MAX_LINES = 700


def test_no_module_imports_itself_through_others():
    circles = HOUSE.module_circles()
    assert not circles, "import circles:\n" + "\n".join(describe(c) for c in circles)


def test_arrows_between_rooms_run_one_way():
    circles = HOUSE.room_circles()
    lines = [" -> ".join([House.room(c[0].source)] + [House.room(i.target) for i in c]) + ": " +
             ", ".join(f"{i.where()} imports {i.target}" for i in c) for c in circles]
    assert not circles, "rooms that import each other:\n" + "\n".join(lines)


@pytest.mark.parametrize("room", HOUSE.rooms_with_a_face())
def test_a_room_imports_what_its_docstring_says(room):
    problems = HOUSE.broken_promises(room)
    assert not problems, "\n".join(problems)


def _modules_of(room):
    return [m.rsplit(".", 1)[1] for m, p in HOUSE.files.items()
            if House.room(m) == room and m != room and not p.endswith("__main__.py")]


@pytest.mark.parametrize("room", [r for r in HOUSE.rooms_with_a_face() if r.startswith("trainer.") or r == "callbacks"])
def test_a_room_names_every_module_it_holds(room):
    doc = ast.get_docstring(ast.parse(open(os.path.join(REPO, HOUSE.files[room]), encoding="utf-8").read())) or ""
    unnamed = [m for m in _modules_of(room) if f"``{m}``" not in doc and f"``{m}." not in doc]
    assert not unnamed, f"{HOUSE.files[room]}'s docstring does not name ``{'``, ``'.join(unnamed)}`` (say what each holds)"


def test_the_architecture_page_names_every_module():
    page = open(os.path.join(REPO, "docs", "explanation", "architecture.md"), encoding="utf-8").read()
    tree = page[page.index("```text\ntrainer/"):]
    tree = tree[:tree.index("\n```", 5)]
    unnamed = [p for m, p in sorted(HOUSE.files.items()) if m.startswith(("trainer.", "callbacks."))
               and not p.endswith(("__init__.py", "__main__.py"))
               and not re.search(r"(?<![\w.])%s(\.py)?\b" % re.escape(m.rsplit(".", 1)[1]), tree)]
    assert not unnamed, f"docs/explanation/architecture.md's tree does not name: {unnamed}"


# who may import the top floors: the commands (trainer.cli) are imported by nobody, the launcher (trainer.launch) by
# the commands alone, the tasks (models) by nobody in trainer/ or callbacks/
TOP_FLOORS = {"trainer.cli": set(), "trainer.launch": {"trainer.cli"}, "models": set()}


def test_the_loop_never_imports_the_commands_the_launcher_or_the_tasks():
    wrong = [i for i in HOUSE.imports if House.room(i.target) in TOP_FLOORS
             and House.room(i.source) != House.room(i.target)
             and House.room(i.source) not in TOP_FLOORS[House.room(i.target)]]
    assert not wrong, "\n".join(f"{i.where()} imports {i.target}" for i in wrong)


def test_trainer_keeps_at_most_20_modules_at_its_top():
    top = sorted(n for n in os.listdir(os.path.join(REPO, "trainer")) if n.endswith(".py") and n != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at trainer/'s top: {top}"


def test_no_module_is_longer_than_700_lines():
    long = []
    for path in HOUSE.files.values():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long.append(f"{path}: {n} lines")
    assert not long, "\n".join(long)


# ---- the rules can fail: a small house that breaks each of them -------------------------------------------
def _write(root, files):
    for path, text in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(textwrap.dedent(text))


def test_the_rules_find_a_lazy_circle_a_room_circle_and_a_broken_promise(tmp_path):
    _write(tmp_path, {
        "trainer/__init__.py": '"""The face."""\n',
        "trainer/args.py": "def plan():\n    from .low import cfg\n",  # lazy: inside a function
        "trainer/low.py": "from .args import plan\ncfg = 1\n",
        "trainer/data/__init__.py": '"""Data.\n\nMay import: ``trainer.errors``.\n\nUsed by: the loop.\n"""\n',
        "trainer/data/batch.py": "from trainer.checkpoint import store\n",
        "trainer/checkpoint/__init__.py": '"""Files.\n\nMay import: ``trainer.data``.\n"""\n',
        "trainer/checkpoint/store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.args import plan\n"
                                       "from ..data import loader\n",
        "trainer/data/loader.py": "",
        "trainer/errors.py": "",
        "callbacks/__init__.py": '"""Callbacks."""\n',
    })
    house = House(str(tmp_path))
    [circle] = house.module_circles()
    assert {i.source for i in circle} == {"trainer.args", "trainer.low"}
    assert any(i.where() == "trainer/args.py:2" for i in circle)
    rooms = sorted(sorted(House.room(i.source) for i in c) for c in house.room_circles())
    assert rooms == [["trainer.args", "trainer.low"], ["trainer.checkpoint", "trainer.data"]]  # a module at the top is a room
    data = house.broken_promises("trainer.data")
    assert "trainer/data/batch.py:1 imports trainer.checkpoint.store, which trainer/data/__init__.py's " \
           "'May import:' does not name" in data
    assert any("names ``trainer.errors``, which no module of trainer.data imports" in p for p in data)
    assert house.broken_promises("trainer.checkpoint") == []  # the TYPE_CHECKING import of args does not count
    assert house.broken_promises("callbacks") == ["callbacks/__init__.py: its docstring has no 'May import:' paragraph"]
