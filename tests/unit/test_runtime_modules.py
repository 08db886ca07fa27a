"""The module graph: no import cycles in the runtime or in the whole package, and a Checkpointer that is a facade over its collaborators and
over the recovery mode's loop (runtime/loops/: one module per mode, chosen once).

The graph is read from the source with ``ast`` (every ``import`` inside azext_elastictrain/runtime and its
subpackages, at module level or inside a function), so a cycle fails here before it fails a worker at import time.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import azext_elastictrain.runtime as runtime
from azext_elastictrain.core import launch
from azext_elastictrain.runtime import loops

RUNTIME = Path(runtime.__file__).parent
PACKAGE = "azext_elastictrain.runtime"


def imports_of(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that the file at ``path`` imports (``from package import mod`` included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                found |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(package + "."):
                found.add(node.module)
    return found


def graph(directory: Path, package: str) -> dict[str, set[str]]:
    """Every module under ``directory`` (a subpackage is its __init__; the package's own __init__, which only
    names the exports, is left out) -> the modules of it that it imports."""
    modules: dict[str, Path] = {}
    for path in directory.rglob("*.py"):
        parts = path.relative_to(directory).with_suffix("").parts
        name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
        if name != package:
            modules[name] = path
    return {name: imports_of(path, package) & set(modules) for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_whole_package_has_no_import_cycle() -> None:
    """Every module of the extension, the az face, backends and core/ included (a type-only import counts: it is
    a cycle in the reading, even where Python would not run into it)."""
    import azext_elastictrain

    edges = graph(Path(azext_elastictrain.__file__).parent, "azext_elastictrain")
    assert "azext_elastictrain.core.aks.manifests" in edges and len(edges) >= 100, len(edges)
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_the_runtime_has_no_import_cycle() -> None:
    edges = graph(RUNTIME, PACKAGE)
    assert f"{PACKAGE}.checkpoint" in edges and f"{PACKAGE}.loops.in_process" in edges and len(edges) >= 10, \
        sorted(edges)
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_the_cycle_finder_finds_a_cycle_through_a_from_package_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert find_cycle(graph(pkg, "pkg")) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(graph(pkg, "pkg")) is None


def test_no_collaborator_imports_the_facade() -> None:
    edges = graph(RUNTIME, PACKAGE)
    importers = sorted(name for name, deps in edges.items() if f"{PACKAGE}.checkpoint" in deps)
    assert importers == [], importers


def test_the_facade_leaves_torch_and_storage_to_its_collaborators() -> None:
    """checkpoint.py sequences; the collectives, DCP and blob calls live in modules that can be tested alone."""
    tree = ast.parse((RUNTIME / "checkpoint.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, imported
    assert "azext_elastictrain.runtime.storage" not in imported


# -- the recovery modes' loops (runtime/loops/) ------------------------------------------------------------------

MODE_MODULES = {f"{PACKAGE}.loops.restart", f"{PACKAGE}.loops.in_process"}


def test_each_recovery_mode_has_a_loop_of_its_own_and_an_unknown_mode_none() -> None:
    chosen = {mode: loops.for_mode(mode) for mode in launch.RECOVERY_MODES}
    assert set(loops.LOOPS) == set(launch.RECOVERY_MODES)
    assert {loop.__module__ for loop in chosen.values()} == MODE_MODULES
    assert all(issubclass(loop, loops.TrainingLoop) for loop in chosen.values())
    with pytest.raises(ValueError, match="no training loop for the recovery mode 'elsewhere'"):
        loops.for_mode("elsewhere")


def test_a_modes_loop_imports_no_other_modes_loop_and_the_facade_none() -> None:
    """A mode is one module: it shares the interface (loops.base) and the collaborators, never another mode's
    code; the facade reaches the modes through the choice (loops/__init__) only."""
    edges = graph(RUNTIME, PACKAGE)
    for module in MODE_MODULES:
        assert not edges[module] & (MODE_MODULES | {f"{PACKAGE}.loops"}), (module, sorted(edges[module]))
    assert not edges[f"{PACKAGE}.checkpoint"] & MODE_MODULES, sorted(edges[f"{PACKAGE}.checkpoint"])


def test_the_facade_branches_on_no_recovery_mode() -> None:
    """checkpoint.py holds no mode's loop: no test of the mode (``in_process``, ``recovery``) in an ``if``, and
    none of the in-process mode's modules (the replica group, its data, its membership) imported."""
    tree = ast.parse((RUNTIME / "checkpoint.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            names = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            names |= {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            assert not names & {"in_process", "recovery"}, ast.unparse(node.test)
    imported = graph(RUNTIME, PACKAGE)[f"{PACKAGE}.checkpoint"]
    assert not imported & {f"{PACKAGE}.{m}" for m in ("replicas", "replica_data", "membership")}, imported


# -- the whole package ----------------------------------------------------------------------------------------

PACKAGE_ROOT = RUNTIME.parent


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run, so they make no cycle)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(inner) for child in node.body for inner in ast.walk(child)}
    return skipped


def package_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Every module of ``package`` (subpackages included; a package is its __init__) -> the modules of it that
    it imports when run, at module level or inside a function."""
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
        modules[name] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_only(tree)
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from pkg.sub import mod" imports the module pkg.sub.mod; "from pkg.mod import name", pkg.mod
                found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                          for alias in node.names}
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def test_the_package_has_no_import_cycle() -> None:
    edges = package_graph(PACKAGE_ROOT, "azext_elastictrain")
    assert "azext_elastictrain.backends.local.starting" in edges and len(edges) >= 60, sorted(edges)
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_package_graph_sees_imports_in_functions_and_not_those_for_the_type_checker(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n")
    (pkg / "c.py").write_text("from pkg.sub.a import f\n")
    assert find_cycle(package_graph(pkg, "pkg")) is None
    (pkg / "sub" / "b.py").write_text("import pkg.c\n")
    assert find_cycle(package_graph(pkg, "pkg")) == ["pkg.c", "pkg.sub.a", "pkg.sub.b", "pkg.c"]
