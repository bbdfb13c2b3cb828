"""The house's layout, read from the source (AST): every import arrow in trainer/ and sweeper/
points down, none closes a circle, and the trainer never imports the sweeper. Lazy imports inside
functions and TYPE_CHECKING imports count: they are arrows a reader follows too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# trainer/'s floors, lowest first (trainer/__init__.py says what each holds). A module imports its
# own floor and the floors below; the contracts are the ground floor, the doors the top.
CONTRACTS = {"config", "options", "data", "idx", "limits", "override_checks", "metrics", "errors"}
WINGS = ["core", "gpu", "ranks", "record", "lifecycle"]
DOORS = {"run", "worker", "worker_points", "warm_up", "step", "__main__"}


def modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name (a package by its own name)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


KNOWN = modules("trainer") | modules("sweeper")


def imports(path: Path) -> set[str]:
    """The trainer and sweeper modules ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from pkg import mod` names a module, `from mod import f` the module
                found.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in KNOWN else node.module)
    return {m for m in found if m in KNOWN}


GRAPH = {name: imports(path) - {name} for name, path in KNOWN.items()}


def floor(module: str) -> int:
    """0 for the contracts, 1.. for the wings in order, the top for the doors."""
    parts = module.split(".")
    if len(parts) == 1:  # trainer/__init__.py: a docstring
        return 0
    if parts[1] in CONTRACTS:
        return 0
    if parts[1] in WINGS:
        return 1 + WINGS.index(parts[1])
    assert parts[1] in DOORS, f"{module}: not a contract, a wing or a door; give it a floor in tests/test_layout.py"
    return 1 + len(WINGS)


def test_every_trainer_module_has_a_floor_and_every_wing_says_what_lives_there():
    for name in modules("trainer"):
        floor(name)
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((ROOT / "trainer" / wing / "__init__.py").read_text()))
        assert doc and "Imports" in doc, f"trainer/{wing}/__init__.py must say what lives there and what it imports"


def test_trainer_arrows_point_down():
    up = [
        f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)})"
        for a in modules("trainer")
        for b in GRAPH[a]
        if b.startswith("trainer") and floor(b) > floor(a)
    ]
    assert not up, "imports from a lower floor to a higher one:\n" + "\n".join(up)


def test_the_trainer_never_imports_the_sweeper():
    wrong = [f"{a} -> {b}" for a in modules("trainer") for b in GRAPH[a] if b.startswith("sweeper")]
    assert not wrong, wrong


@pytest.mark.parametrize("package", ["trainer", "sweeper"])
def test_no_import_circles(package):
    """Tarjan's strongly connected components over the package's modules: each must be one module."""
    nodes = [n for n in GRAPH if n.split(".")[0] == package]
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w.split(".")[0] != package:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for n in nodes:
        if n not in index:
            visit(n)
    assert not circles, circles


def test_the_layout_test_sees_the_arrows():
    """The graph holds the arrows the checks above judge (an empty one would pass them all)."""
    assert floor("trainer.core.loop") < floor("trainer.run")
    assert floor("trainer.gpu.nccl") < floor("trainer.ranks.parallel") < floor("trainer.record.tracking")
    assert "trainer.ranks.parallel" in GRAPH["trainer.run"]  # the graph sees `from trainer.ranks import parallel`
