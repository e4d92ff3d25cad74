"""The packages' import graph: no cycles (module-level and function-level imports alike, and
none between the subpackages of `market`), roles that never import the server package, and
every module importable on its own.

A cycle hidden in a function-level import still couples two modules and breaks as soon as
someone moves the import up; the roles (miner, verifier, client) talk to the market over
HTTP through `market.marketapi` and must not load its server (`market.service`).
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("market", "miner", "verifier", "client")
ROLES = ("miner", "verifier", "client")
SERVER = "market.service"


@cache
def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            parts = file.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def imported(name: str, file: Path) -> set[str]:
    """The project modules `file` imports anywhere in it (top level, functions, TYPE_CHECKING
    blocks): `from a.b import c` counts as a.b, plus a.b.c when that is a module."""
    known = modules()
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)
    return {t for t in targets if t in known and t != name}


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imported(name, file)) for name, file in modules().items()}


def cycle_in(edges: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[str] | None:
    try:
        list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_the_graph_sees_function_level_and_type_checking_imports() -> None:
    """The walk must find the imports that hide inside functions, or it proves nothing."""
    g = graph()
    assert len(g) > 50
    assert "market.errors" in g["market.roleconfig"]  # top level
    assert "miner.cheats" in g["miner.config"]  # inside a validator
    assert "miner.config" in g["miner.cli"]  # inside a function and under TYPE_CHECKING
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None


def test_no_import_cycles_between_modules() -> None:
    cycle = cycle_in(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycles_between_the_subpackages_of_market() -> None:
    """`market.model` and `market.engine` used to import each other (prompts built engine
    requests; the engines encoded prompts)."""
    def area(name: str) -> str:
        return ".".join(name.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        edges.setdefault(area(name), set()).update(
            area(t) for t in targets if area(t) != area(name))
    cycle = cycle_in(edges)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_roles_never_import_the_server_package() -> None:
    """No import of `market.service` anywhere in a role's modules (at run time too: see
    `test_every_module_imports_on_its_own`)."""
    g = graph()
    wrong = sorted(f"{name} imports {target}" for name, targets in g.items()
                   if name.split(".")[0] in ROLES
                   for target in targets if target.startswith(SERVER))
    assert not wrong, wrong


_IMPORT_EACH = """
import importlib, sys, traceback
names = sys.argv[1:]
ours = lambda m: m.split(".")[0] in {packages!r}
failed = []
for name in names:
    for loaded in [m for m in sys.modules if ours(m)]:
        del sys.modules[loaded]  # each module starts from none of ours loaded
    try:
        importlib.import_module(name)
    except BaseException:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
        continue
    server = sorted(m for m in sys.modules if m.startswith({server!r}))
    if name.split(".")[0] in {roles!r} and server:
        failed.append(name + ": loads the server package: " + ", ".join(server))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.timeout(600)
def test_every_module_imports_on_its_own() -> None:
    """In a fresh interpreter, each module imported with none of ours loaded before it: an
    import that only works in some order fails here, and so does a role module whose
    imports load the server package."""
    names = sorted(n for n in modules() if not n.endswith("__main__"))
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH.format(packages=PACKAGES, roles=ROLES,
                                                               server=SERVER), *names],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
