"""The house's layout, read from the source (AST): every import arrow in trainer/ and sweeper/
points down their floors, none closes a circle, and the trainer never imports the sweeper. Lazy
imports inside functions and TYPE_CHECKING imports count: they are arrows a reader follows too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# trainer/'s floors, lowest first (trainer/__init__.py says what each holds). A module imports its
# own floor and the floors below; the contracts are the ground floor, the doors the top.
CONTRACTS = {"config", "options", "data", "idx", "limits", "override_checks", "hydra_mode", "metrics", "errors"}
WINGS = ["core", "gpu", "ranks", "record", "lifecycle"]
DOORS = {"run", "worker", "worker_points", "warm_up", "step", "__main__"}
# sweeper/'s floors, lowest first (each wing's __init__.py says what it holds and imports): the leaves
# any wing may import, the wings in order, the doors (the flow and the commands) on top.
SWEEPER_LEAVES = {"config", "display", "folders", "points", "timeline"}
SWEEPER_WINGS = ["report", "job", "runners", "plan", "track", "search"]
SWEEPER_DOORS = {"sweep", "__main__", "status", "sync"}


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
    """0 for the contracts (the sweeper's leaves), 1.. for the wings in order, the top for the doors."""
    parts = module.split(".")
    contracts, wings, doors = (
        (CONTRACTS, WINGS, DOORS) if parts[0] == "trainer" else (SWEEPER_LEAVES, SWEEPER_WINGS, SWEEPER_DOORS)
    )
    if len(parts) == 1:  # the package's __init__.py: a docstring
        return 0
    if parts[1] in contracts:
        return 0
    if parts[1] in wings:
        return 1 + wings.index(parts[1])
    assert parts[1] in doors, f"{module}: not a contract, a wing or a door; give it a floor in tests/test_layout.py"
    return 1 + len(wings)


@pytest.mark.parametrize(("package", "wings"), [("trainer", WINGS), ("sweeper", SWEEPER_WINGS)])
def test_every_module_has_a_floor_and_every_wing_says_what_lives_there(package, wings):
    for name in modules(package):
        floor(name)
    for wing in wings:
        doc = ast.get_docstring(ast.parse((ROOT / package / wing / "__init__.py").read_text()))
        assert doc and "Imports" in doc, f"{package}/{wing}/__init__.py must say what lives there and what it imports"


def test_the_sweepers_top_holds_its_doors_and_leaves_only():
    top = [p.name for p in (ROOT / "sweeper").glob("*.py")]
    assert len(top) <= 10, f"sweeper/ holds {len(top)} modules at its top: give the new one its wing"


@pytest.mark.parametrize("package", ["trainer", "sweeper"])
def test_arrows_point_down(package):
    up = [
        f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)})"
        for a in modules(package)
        for b in GRAPH[a]
        if b.startswith(package) and floor(b) > floor(a)
    ]
    assert not up, "imports from a lower floor to a higher one:\n" + "\n".join(up)


def test_no_relative_imports():
    """The graph reads absolute imports only: a relative one would be an arrow no check sees."""
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in KNOWN.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert not relative, relative


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
    assert floor("sweeper.report.study") < floor("sweeper.track.records") < floor("sweeper.sweep")
    assert "sweeper.track.records" in GRAPH["sweeper.sweep"]  # `from sweeper.track import records`
