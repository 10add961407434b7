"""The package's shape: no import cycle among its modules (lazy and by-name imports included), the core never
imports the tooling (evaluation/, cli/, the ``python -m hf_vocabspec.lmeval`` entry), evaluation/ never imports
the entry points (cli/, the lmeval entry), configuration.py and
modeling.py (shipped with every checkpoint) import only torch, transformers and each other, and one home per
concept: the compatibility check (drafter vs target and tokenizer) lives in compatibility.py alone, the
"first line of an exception" helper in _io.py alone."""

from __future__ import annotations

import ast
import os
import subprocess
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


# Within the tooling, layers run one way too: the entry points (the CLI and ``python -m hf_vocabspec.lmeval``) import
# evaluation/, never the reverse (what both need lives in evaluation/, e.g. evaluation/usage.py).
EVALUATION = "hf_vocabspec.evaluation"
ENTRY_POINTS = ("hf_vocabspec.cli", "hf_vocabspec.lmeval")


def evaluation_imports_of_entry_points(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Module of evaluation/ -> the entry-point modules (cli/, the lmeval entry) it imports."""
    def inside(m: str, roots) -> bool:
        return any(m == r or m.startswith(r + ".") for r in roots)

    found = {name: sorted(m for m in deps if inside(m, ENTRY_POINTS))
             for name, deps in graph.items() if inside(name, (EVALUATION,))}
    return {k: v for k, v in found.items() if v}


def test_evaluation_never_imports_the_cli():
    assert evaluation_imports_of_entry_points(_graph()) == {}


def test_evaluation_layer_check_has_power():
    """The edge this rule was made for (evaluation/lmeval.py importing cli/_common.py, issue #38) is reported, a
    relative import of it included; the CLI importing evaluation/ is not."""
    src = "def _resolve(name):\n    from ..cli._common import check_model_name\n"
    graph = {"hf_vocabspec.evaluation.lmeval": imports_of(src, "hf_vocabspec.evaluation.lmeval"),
             "hf_vocabspec.cli._common": {"hf_vocabspec.evaluation.usage"},
             "hf_vocabspec.evaluation.usage": set()}
    assert evaluation_imports_of_entry_points(graph) == {
        "hf_vocabspec.evaluation.lmeval": ["hf_vocabspec.cli._common", "hf_vocabspec.cli._common.check_model_name"]}


def test_layout_checks_have_power():
    """By-name imports are edges, a computed name is refused, and a core -> tooling edge is reported."""
    src = ("import importlib\n"
           "def f():\n    return importlib.import_module('hf_vocabspec.evaluation.offline')\n"
           "def g():\n    return __import__('hf_vocabspec.cli')\n")
    assert imports_of(src, "hf_vocabspec.hub") == {"hf_vocabspec.evaluation.offline", "hf_vocabspec.cli"}
    with pytest.raises(AssertionError, match="computed name"):
        imports_of("import importlib\nname = 'x'\nimportlib.import_module('hf_vocabspec.' + name)\n", "hf_vocabspec.hub")
    graph = {"hf_vocabspec.hub": {"hf_vocabspec.evaluation.offline"}, "hf_vocabspec.evaluation.offline": {"hf_vocabspec.hub"},
             "hf_vocabspec.cli": {"hf_vocabspec.evaluation"}, "hf_vocabspec.cost": {"hf_vocabspec.modeling"}}
    assert core_imports_of_tooling(graph) == {"hf_vocabspec.hub": ["hf_vocabspec.evaluation.offline"]}
    assert find_cycle(graph) == ["hf_vocabspec.evaluation.offline", "hf_vocabspec.hub", "hf_vocabspec.evaluation.offline"]


# --- what ships with every checkpoint (auto_map names these files; trust_remote_code loads them alone) ----------------
SHIPPED = {"configuration.py": set(), "modeling.py": {"configuration"}}  # file -> the shipped modules it may import


def shipped_import_problems(source: str, allowed_relative: set[str]) -> list[str]:
    """What keeps ``source`` from loading without hf_vocabspec: a third-party import other than torch/transformers,
    an absolute import of hf_vocabspec, or a relative import of anything but ``allowed_relative`` (sibling modules
    shipped beside it)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 1 or node.module not in allowed_relative:
                problems.append(f"line {node.lineno}: relative import of {'.' * node.level}{node.module or ''}")
            continue
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            continue
        problems += [f"line {node.lineno}: imports {r}" for r in sorted(roots)
                     if r not in sys.stdlib_module_names and r not in ("torch", "transformers")]
    return problems


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_modules_import_only_stdlib_torch_transformers_and_each_other(name):
    assert shipped_import_problems((PKG / name).read_text(), SHIPPED[name]) == []


def test_shipped_import_check_has_power():
    assert shipped_import_problems("from .configuration import X\nimport torch\n", {"configuration"}) == []
    assert shipped_import_problems("from .._io import first_line\n", set()) == ["line 1: relative import of .._io"]
    assert shipped_import_problems("from .trimming import trim_drafter\n", {"configuration"}) == [
        "line 1: relative import of .trimming"]
    assert shipped_import_problems("import hf_vocabspec.hub\nfrom numpy import x\n", set()) == [
        "line 1: imports hf_vocabspec", "line 2: imports numpy"]


# --- serving plugins (hf_vocabspec.serving): loaded inside other engines' processes ------------------------------
SERVING = "hf_vocabspec.serving"
SERVING_MAY_IMPORT = {"hf_vocabspec.configuration", "hf_vocabspec.modeling"}


def serving_import_problems(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Serving modules -> the package modules they import beyond the shipped files and each other."""
    found = {name: sorted(m for m in deps if m not in SERVING_MAY_IMPORT and not m.startswith(SERVING))
             for name, deps in graph.items() if name.startswith(SERVING)}
    return {k: v for k, v in found.items() if v}


def test_serving_imports_only_the_shipped_files():
    assert any(name.startswith(SERVING) for name in _graph())
    assert serving_import_problems(_graph()) == {}
    assert serving_import_problems({"hf_vocabspec.serving.x": {"hf_vocabspec.modeling", "hf_vocabspec.hub"}}) == {
        "hf_vocabspec.serving.x": ["hf_vocabspec.hub"]}  # power


def test_nothing_imports_serving():
    """The serving plugins are entry points of other engines: nothing in the package depends on them."""
    users = {name: sorted(m for m in deps if m.startswith(SERVING)) for name, deps in _graph().items()
             if not name.startswith(SERVING)}
    assert {k: v for k, v in users.items() if v} == {}


# --- one home per concept ---------------------------------------------------------------------------------------
# The compatibility check: its functions and error are defined in compatibility.py, the error raised there alone, and
# no other module compares a tokenizer fingerprint with the one a drafter recorded (each caller asks the one check).
COMPAT_HOME = "hf_vocabspec.compatibility"
COMPAT_NAMES = {"compatibility_error", "check_compatibility", "check_tokenizer_belongs", "check_same_tokenizer",
                "target_rows", "tokenizer_sha256", "DrafterMismatchError",
                "vocab_fit_error", "check_drafter_compatibility"}  # (the last two: names of former second copies)
# a counts file checks its OWN tokenizer fingerprint (counts vs tokenizer, not a drafter vs a target)
FINGERPRINT_COMPARE_ALLOWED = {"hf_vocabspec.coverage"}
FIRST_LINE_HOME = "hf_vocabspec._io"
# modeling.py ships alone with checkpoints and cannot import _io: its one inline copy is the exception
FIRST_LINE_INLINE_ALLOWED = {"hf_vocabspec.modeling"}


def _called_name(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _is_fingerprint(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Call) and _called_name(node) in ("tokenizer_sha256", "_fingerprint"))
            or (isinstance(node, ast.Attribute) and node.attr == "target_tokenizer_sha256"))


def _is_str_splitlines(node: ast.AST) -> bool:
    """``str(x).splitlines()`` / ``str(x).strip().splitlines()``: an inline first-line helper."""
    if not (isinstance(node, ast.Call) and _called_name(node) == "splitlines"):
        return False
    inner = node.func.value
    while isinstance(inner, ast.Call) and _called_name(inner) == "strip":
        inner = inner.func.value
    return isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "str"


def home_violations(source: str, name: str) -> list[str]:
    """Second copies of a concept with one home in ``source`` (module ``name``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in COMPAT_NAMES and name != COMPAT_HOME:
                found.append(f"line {node.lineno}: defines {node.name} (its home is {COMPAT_HOME})")
            if ("first_line" in node.name or "one_line" in node.name) and name != FIRST_LINE_HOME:
                found.append(f"line {node.lineno}: defines {node.name} (use {FIRST_LINE_HOME}.first_line)")
        elif isinstance(node, ast.Raise) and node.exc is not None and name != COMPAT_HOME:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if (getattr(exc, "id", None) or getattr(exc, "attr", None)) == "DrafterMismatchError":
                found.append(f"line {node.lineno}: raises DrafterMismatchError (only {COMPAT_HOME} does)")
        elif isinstance(node, ast.Compare) and name != COMPAT_HOME and name not in FINGERPRINT_COMPARE_ALLOWED:
            if any(_is_fingerprint(side) for side in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: compares tokenizer fingerprints (ask {COMPAT_HOME})")
        elif _is_str_splitlines(node) and name not in (FIRST_LINE_HOME, *FIRST_LINE_INLINE_ALLOWED):
            found.append(f"line {node.lineno}: takes an exception's first line inline (use {FIRST_LINE_HOME}.first_line)")
    return sorted(found, key=lambda text: int(text.split(":")[0].split()[1]))


def test_one_home_per_concept():
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    found = {name: v for name, path in sorted(files.items()) if (v := home_violations(path.read_text(), name))}
    assert found == {}


def test_one_home_check_has_power():
    src = ("def vocab_fit_error(a, b):\n    pass\n"
           "def _first_line(err):\n    return str(err).splitlines()[0]\n"
           "def f(tok, d):\n    if tokenizer_sha256(tok) != d.config.target_tokenizer_sha256:\n"
           "        raise DrafterMismatchError('x')\n"
           "    why = str(e).strip().splitlines()\n")
    assert home_violations(src, "hf_vocabspec.hub") == [
        "line 1: defines vocab_fit_error (its home is hf_vocabspec.compatibility)",
        "line 3: defines _first_line (use hf_vocabspec._io.first_line)",
        "line 4: takes an exception's first line inline (use hf_vocabspec._io.first_line)",
        "line 6: compares tokenizer fingerprints (ask hf_vocabspec.compatibility)",
        "line 7: raises DrafterMismatchError (only hf_vocabspec.compatibility does)",
        "line 8: takes an exception's first line inline (use hf_vocabspec._io.first_line)",
    ]
    assert home_violations(src.replace("_first_line", "first_line"), "hf_vocabspec._io")[1:3] == [
        "line 6: compares tokenizer fingerprints (ask hf_vocabspec.compatibility)",
        "line 7: raises DrafterMismatchError (only hf_vocabspec.compatibility does)",
    ]
    assert home_violations(src.split("def _first_line")[0], "hf_vocabspec.compatibility") == []


def test_new_modules_declare_all():
    """Modules created for one home per concept declare their public names."""
    for name in ("configuration", "modeling", "trimming", "compatibility"):
        tree = ast.parse((PKG / f"{name}.py").read_text())
        declared = [n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                                               for t in n.targets)]
        assert declared, f"{name}.py has no __all__"
        module = __import__(f"hf_vocabspec.{name}", fromlist=["__all__"])
        assert all(hasattr(module, n) for n in module.__all__), name


# --- one home per concept: the round model and tau live in cost.py; plotting lives in the tooling ------------------
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


# --- tests: shared tiny models and helpers live in tests/tiny.py, tests/marginals.py and tests/conftest.py ---------
def test_modules_import(source: str) -> list[str]:
    """Test modules (test_*) that ``source`` imports: each test module stands alone."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [n for n in names if n.split(".")[0].startswith("test_")]
    return found


test_modules_import.__test__ = False  # a helper, not a test


def test_test_modules_do_not_import_each_other():
    tests = Path(__file__).parent
    found = {p.name: names for p in sorted(tests.glob("*.py")) if (names := test_modules_import(p.read_text()))}
    assert found == {}, f"move what they share to tests/tiny.py, tests/marginals.py or tests/conftest.py: {found}"
    assert test_modules_import("def f():\n    from test_ssd import pair\n") == ["test_ssd"]  # power


# --- lazy imports ---------------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def test_import_hands_out_the_pipeline_lazily():
    code = ("import sys, hf_vocabspec as h; heavy = [m for m in ('optuna', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy; "
            "[getattr(h, n) for n in h.__all__]; h.selection.select_vocabulary; h.cost.measure_draft_latency; "
            "assert h.coverage.TokenCounts is h.TokenCounts; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
