"""The house's room rules, read from the code: which module imports which, and what each room says it may import.

A module's imports are read from its source (``ast``), imports inside functions included; an import under
``if TYPE_CHECKING:`` is left out (it never runs). Only imports of the project's own packages count.

A room is a sub-package of ``trainer`` (``trainer.checkpoint``) or a module at its top (``trainer.args``), the
``callbacks`` package, or the ``models`` package. The rules (tests/test_rooms.py):

- no circle of modules;
- no circle of rooms (every arrow between rooms runs one way, down);
- a sub-package's ``__init__.py`` docstring has a paragraph that starts ``May import:`` and names, in double
  back-ticks, each room (or module of a room) it imports: ``trainer.checkpoint`` covers every module of that room,
  ``trainer.*`` any room, ``trainer`` alone the package's face (its ``__version__``); a dotted name below a module
  (``trainer.task.Preprocessing``) stands for that module; the list ends at the first "never" (what follows says
  in words what the room never imports); it is exact (a name no module of the room imports is a stale promise).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections import defaultdict
from typing import Dict, Iterator, List, Optional, Set, Tuple

PACKAGES = ("trainer", "callbacks", "models")


@dataclasses.dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted
    path: str  # the importing file, relative to the root
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


class House:
    """The modules under ``root``'s packages and the imports between them."""

    def __init__(self, root: str, packages=PACKAGES):
        self.root = root
        self.files: Dict[str, str] = {}  # module -> relative path
        for package in packages:
            for folder, dirs, names in os.walk(os.path.join(root, package)):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
                for name in sorted(names):
                    if name.endswith(".py"):
                        rel = os.path.relpath(os.path.join(folder, name), root)
                        parts = rel[:-3].split(os.sep)
                        if parts[-1] == "__init__":
                            parts = parts[:-1]
                        self.files[".".join(parts)] = rel
        self.imports: List[Import] = [imp for module in sorted(self.files) for imp in self._read(module)]

    # ---- reading ------------------------------------------------------------------------------------------
    def _resolve(self, name: str) -> Optional[str]:
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def _read(self, module: str) -> Iterator[Import]:
        path = self.files[module]
        with open(os.path.join(self.root, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # `from pkg import name`: the module pkg.name when there is one, else pkg itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in self.files else base for a in node.names]
            else:
                continue
            for name in dict.fromkeys(names):
                target = self._resolve(name)
                if target and target != module:
                    yield Import(module, target, path, node.lineno)

    # ---- rooms --------------------------------------------------------------------------------------------
    @staticmethod
    def room(module: str) -> str:
        parts = module.split(".")
        if parts[0] == "trainer" and len(parts) > 1:
            return ".".join(parts[:2])
        return parts[0]

    def rooms_with_a_face(self) -> List[str]:
        """Rooms that are packages (their ``__init__.py`` holds the docstring the rules read)."""
        return sorted(m for m, p in self.files.items()
                      if p.endswith("__init__.py") and self.room(m) == m and m != "trainer")

    # ---- the rules ----------------------------------------------------------------------------------------
    def module_circles(self) -> List[List[Import]]:
        return _circles({(i.source, i.target): i for i in self.imports})

    def room_arrows(self) -> Dict[Tuple[str, str], Import]:
        """``{(room, room it imports): the first import that makes the arrow}``."""
        arrows: Dict[Tuple[str, str], Import] = {}
        for imp in self.imports:
            a, b = self.room(imp.source), self.room(imp.target)
            if a != b:
                arrows.setdefault((a, b), imp)
        return arrows

    def room_circles(self) -> List[List[Import]]:
        return _circles(self.room_arrows())

    def may_import(self, room: str) -> Optional[List[str]]:
        """The names of the room's ``May import:`` paragraph, or None where it has none."""
        path = os.path.join(self.root, self.files[room])
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        match = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
        if match is None:
            return None
        allowed = re.split(r"\bnever\b", match.group(1), maxsplit=1, flags=re.I)[0]
        names = re.findall(r"``((?:%s)(?:\.[\w*]+)*)``" % "|".join(PACKAGES), allowed)
        return list(dict.fromkeys(n if n.endswith("*") else (self._resolve(n) or n) for n in names))

    def broken_promises(self, room: str) -> List[str]:
        """What the room imports that its list does not name, and what its list names that it never imports."""
        allowed = self.may_import(room)
        face = self.files[room]
        if allowed is None:
            return [f"{face}: its docstring has no 'May import:' paragraph"]
        problems = []
        for name in allowed:
            if not name.endswith("*") and name not in self.files:
                problems.append(f"{face}: 'May import:' names ``{name}``, which is no module of the house")
        used: Set[str] = set()
        for imp in self.imports:
            if self.room(imp.source) != room or self.room(imp.target) == room:
                continue
            covering = [n for n in allowed if _covers(n, imp.target)]
            if not covering:
                problems.append(f"{imp.where()} imports {imp.target}, which {face}'s 'May import:' does not name")
            used.update(covering)
        problems += [f"{face}: 'May import:' names ``{n}``, which no module of {room} imports"
                     for n in allowed if n not in used and not n.endswith("*")]
        return problems


def _covers(name: str, module: str) -> bool:
    if name == "trainer":  # the package's face only: trainer.* is every room
        return module == name
    if name.endswith(".*"):
        return module.startswith(name[:-1])
    return module == name or module.startswith(name + ".")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, leaving out the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _circles(edges: Dict[Tuple[str, str], Import]) -> List[List[Import]]:
    """One circle of imports per strongly connected component of more than one node (Tarjan)."""
    graph: Dict[str, List[str]] = defaultdict(list)
    for a, b in sorted(edges):
        graph[a].append(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_circle(component, graph, edges) for component in components]


def _one_circle(component: Set[str], graph, edges) -> List[Import]:
    """A closed walk through the component, as the imports that make it (a breadth-first path back to the start)."""
    start = min(component)
    previous = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w not in component:
                continue
            if w == start:
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                nodes = list(reversed(path)) + [start]
                return [edges[(a, b)] for a, b in zip(nodes, nodes[1:])]
            if w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError(f"no circle through {start}")  # a strongly connected component always has one


def describe(circle: List[Import]) -> str:
    return " -> ".join([circle[0].source] + [i.target for i in circle]) + " (" + \
        ", ".join(f"{i.where()} imports {i.target}" for i in circle) + ")"


def floors(house: House) -> Dict[int, List[str]]:
    """The rooms by floor: a room stands one floor above the highest room it imports (floor 1 imports none)."""
    below: Dict[str, Set[str]] = defaultdict(set)
    for a, b in house.room_arrows():
        below[a].add(b)
    rooms = {house.room(m) for m in house.files}
    floor: Dict[str, int] = {}

    def of(room: str) -> int:  # the room graph has no circle (test_arrows_between_rooms_run_one_way)
        if room not in floor:
            floor[room] = 1 + max((of(b) for b in below[room]), default=0)
        return floor[room]

    by_floor: Dict[int, List[str]] = defaultdict(list)
    for room in sorted(rooms):
        by_floor[of(room)].append(room)
    return dict(by_floor)


if __name__ == "__main__":  # python tests/rooms.py: the rooms by floor, top floor first
    import sys

    here = House(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for number, names in sorted(floors(here).items(), reverse=True):
        print(f"{number:>2}  {', '.join(names)}")
