"""The package's shape: no import cycle among its modules (lazy and by-name imports included), the core never
imports the tooling (evaluation/, cli/, the ``python -m hf_vocabspec.lmeval`` entry), and drafter.py (shipped
with every checkpoint) imports only torch and transformers."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import hf_vocabspec

PKG = Path(hf_vocabspec.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_IMPORT_CALLS = {"import_module", "__import__"}


def _lazy_targets() -> set[str]:
    """The package's own lazy attribute table (PEP 562 __getattr__): edges from hf_vocabspec to those modules."""
    return {f"hf_vocabspec.{m}" for m in (*hf_vocabspec._LAZY.values(), *hf_vocabspec._SUBMODULES)}


def imports_of(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every hf_vocabspec module this source imports, at any depth (function-level too), including by name:
    ``importlib.import_module("hf_vocabspec.x")`` and ``__import__("hf_vocabspec.x")`` are edges like any
    import. A call with a computed name hides an edge, so it fails here (the package's lazy __getattr__ is
    the one exception: its table is read instead)."""
    package = name if is_package else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
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
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called not in _IMPORT_CALLS or not node.args:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if arg.value.startswith("hf_vocabspec"):
                    out.add(arg.value)
            elif name == "hf_vocabspec":
                out.update(_lazy_targets())
            else:
                raise AssertionError(f"{name} line {node.lineno}: {called}() with a computed name hides an import "
                                     "edge; name the module literally")
    return out


def _imports(path: Path) -> set[str]:
    return imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


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


TOOLING = ("hf_vocabspec.evaluation", "hf_vocabspec.cli", "hf_vocabspec.lmeval")


def core_imports_of_tooling(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Core module (anything outside the TOOLING modules) -> the tooling modules it imports."""
    def tooling(m: str) -> bool:
        return any(m == t or m.startswith(t + ".") for t in TOOLING)

    found = {name: sorted(m for m in deps if tooling(m)) for name, deps in graph.items() if not tooling(name)}
    return {k: v for k, v in found.items() if v}


def test_core_never_imports_tooling():
    assert core_imports_of_tooling(_graph()) == {}


def test_layout_checks_have_power():
    """By-name imports are edges, a computed name is refused, and a core -> tooling edge is reported."""
    src = ("import importlib\n"
           "def f():\n    return importlib.import_module('hf_vocabspec.evaluation.offline')\n"
           "def g():\n    return __import__('hf_vocabspec.cli')\n")
    assert imports_of(src, "hf_vocabspec.hub") == {"hf_vocabspec.evaluation.offline", "hf_vocabspec.cli"}
    with pytest.raises(AssertionError, match="computed name"):
        imports_of("import importlib\nname = 'x'\nimportlib.import_module('hf_vocabspec.' + name)\n", "hf_vocabspec.hub")
    graph = {"hf_vocabspec.hub": {"hf_vocabspec.evaluation.offline"}, "hf_vocabspec.evaluation.offline": {"hf_vocabspec.hub"},
             "hf_vocabspec.cli": {"hf_vocabspec.evaluation"}, "hf_vocabspec.cost": {"hf_vocabspec.drafter"}}
    assert core_imports_of_tooling(graph) == {"hf_vocabspec.hub": ["hf_vocabspec.evaluation.offline"]}
    assert find_cycle(graph) == ["hf_vocabspec.evaluation.offline", "hf_vocabspec.hub", "hf_vocabspec.evaluation.offline"]


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


# --- one home per concept (issue #29): the round model and tau live in cost.py; plotting lives in the tooling ----
ROUND_MODEL_HOME = "hf_vocabspec.cost"
# what models a round (its time, its yield tau, the speedup they make): defined in cost.py and nowhere else
ROUND_MODEL_NAMES = frozenset({
    "RoundModel", "RoundYield", "SSDProjection", "SimulatedRounds", "tokens_per_round", "mean_tokens_per_round",
    "simulate_rounds", "simulated_accepted_length", "expected_accepted_length", "iid_acceptance",
    "speculative_speedup", "round_seconds", "ssd_round_seconds", "ssd_tokens_per_round", "project_speedup",
    "project_ssd_speedup",
})


def _is_plus_one(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
            and any(isinstance(side, ast.Constant) and side.value == 1 for side in (node.left, node.right)))


def round_model_copies(source: str) -> list[str]:
    """Where a module holds its own piece of the round model: a function, method or class named like one of
    cost.py's (ROUND_MODEL_NAMES), or the i.i.d. tau's power ``a ** (L + 1)`` (the heart of
    (1 - a^(L+1)) / (1 - a)) written out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in ROUND_MODEL_NAMES:
            found.append(f"line {node.lineno}: defines {node.name}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _is_plus_one(node.right):
            found.append(f"line {node.lineno}: a ** (L + 1), the i.i.d. tau formula")
    return found


def test_round_model_and_tau_live_only_in_cost():
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    assert ROUND_MODEL_HOME in files
    copies = {name: found for name, path in files.items() if name != ROUND_MODEL_HOME
              and (found := round_model_copies(path.read_text()))}
    assert copies == {}, f"the round model / tau has one home, {ROUND_MODEL_HOME}; call it instead: {copies}"
    home = round_model_copies(files[ROUND_MODEL_HOME].read_text())
    assert any("tokens_per_round" in f for f in home) and any("RoundModel" in f for f in home)


def test_round_model_check_has_power():
    assert round_model_copies("def tau(a, n):\n    return (1 - a ** (n + 1)) / (1 - a)\n") == [
        "line 2: a ** (L + 1), the i.i.d. tau formula"]
    assert round_model_copies("class P:\n    def round_seconds(self):\n        return 0\n") == [
        "line 2: defines round_seconds"]
    assert round_model_copies("x = 2 ** 62 + a ** 2\n") == []  # other powers are not the formula


def matplotlib_imports(source: str) -> list[int]:
    """Lines that import matplotlib (at any depth, function-level too)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "matplotlib" or n.startswith("matplotlib.") for n in names):
            lines.append(node.lineno)
    return lines


def test_plotting_only_in_the_tooling():
    def tooling(m: str) -> bool:
        return any(m == t or m.startswith(t + ".") for t in TOOLING)

    plotting_core = {name: lines for p in PKG.rglob("*.py")
                     if not tooling(name := _module_name(p)) and (lines := matplotlib_imports(p.read_text()))}
    assert plotting_core == {}, f"core modules that plot (move it to hf_vocabspec/evaluation/plots.py): {plotting_core}"
    assert matplotlib_imports("def f():\n    from matplotlib.figure import Figure\n") == [2]  # power
