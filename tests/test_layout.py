"""The package's shape: no import cycle among its modules (lazy imports included), the core never imports
the evaluation tooling, and drafter.py (shipped with every checkpoint) imports only torch and transformers."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import hf_vocabspec

PKG = Path(hf_vocabspec.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every hf_vocabspec module this file imports, at any depth of the file (function-level too).

    ``importlib.import_module("hf_vocabspec....")`` by name is not an edge: drafter.py uses it to reach optional
    runtime modes (SSD) only when called, so the shipped file still loads without the package."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("hf_vocabspec"):
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)  # `from . import x` imports module x
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hf_vocabspec"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PKG.rglob("*.py") if "custom_generate" not in p.parts}
    graph = {}
    for name, path in files.items():
        graph[name] = {m for m in _imports(path) if m in files and m != name}
    return graph


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> imported modules), or None. Edges from a module to its own
    packages are skipped (importing a submodule runs its package's __init__ first, which is not a cycle)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in _packages_of(node):
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_catches_a_cycle():
    """Power check: the detector reports a real cycle, and ignores package edges."""
    assert find_cycle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == ["p.a", "p.b", "p.c", "p.a"]
    assert find_cycle({"p.a": {"p"}, "p": set()}) is None


def test_core_never_imports_evaluation_tooling():
    graph = _graph()
    offenders = {name: sorted(m for m in deps if m.startswith("hf_vocabspec.evaluation"))
                 for name, deps in graph.items()
                 if not name.startswith(("hf_vocabspec.evaluation", "hf_vocabspec.cli")) and name != "hf_vocabspec.offline"}
    assert not {k: v for k, v in offenders.items() if v}


def test_drafter_module_imports_only_stdlib_torch_and_transformers():
    tree = ast.parse((PKG / "drafter.py").read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"drafter.py has a relative import (line {node.lineno}): it ships alone with checkpoints")
    third_party = {r for r in roots if r not in sys.stdlib_module_names}
    assert third_party <= {"torch", "transformers"}, third_party
