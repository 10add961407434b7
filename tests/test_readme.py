"""Every ```python block of README.md runs as written, in a fresh process, after the README's setup: a block and the
blocks that run after it (``after=``) share one process, in README order, as a reader runs them.

A block may be preceded by an HTML comment that the harness reads (and a reader does not see):

    <!-- readme-test: name=api -->            other blocks can say after=api (its code runs first, same process)
    <!-- readme-test: after=api hub -->       needs a Hub: the test starts tests/hub_server.py and sets
                                              HF_ENDPOINT/HF_TOKEN for the process (the block sets nothing)
    <!-- readme-test: shrink=max_sequences=100->max_sequences=8 -->
                                              the test runs the block with that text replaced (it must occur
                                              exactly once): a user's size shrunk by the block's own argument,
                                              as the shell commands are shrunk by their own options

Blocks that load real models (``offline:`` names, directly or through ``after=``) are integration tests;
the others run in the fast suite. Sections added later are picked up automatically. The fast suite also checks
statically that every block, with its ``after=`` blocks, defines every name it uses (the "five lines" once
used ``torch`` and ``inputs`` without defining them). A snippet that cannot run must not be a ```python block.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*readme-test:(?P<body>.*?)-->")


@dataclass
class Block:
    line: int
    code: str
    name: str | None = None
    after: list[str] = field(default_factory=list)
    hub: bool = False
    shrink: list[tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"README.md:{self.line}" + (f"[{self.name}]" if self.name else "")

    @property
    def run_code(self) -> str:
        """The code the test runs: the block with its ``shrink=`` replacements."""
        code = self.code
        for old, new in self.shrink:
            code = code.replace(old, new)
        return code


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text (indented ones in list items too), with their directives."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        start, lang = i, m["lang"]
        j = i + 1
        while j < len(lines) and not _FENCE.match(lines[j]):
            j += 1
        if lang == "python":
            block = Block(start + 1, textwrap.dedent("\n".join(lines[start + 1: j])))
            prev = lines[start - 1] if start else ""
            d = _DIRECTIVE.search(prev)
            if d:
                for word in d["body"].split():
                    if word.startswith("name="):
                        block.name = word[5:]
                    elif word.startswith("after="):
                        block.after += word[6:].split(",")
                    elif word == "hub":
                        block.hub = True
                    elif word.startswith("shrink=") and "->" in word:
                        old, new = word[7:].split("->", 1)
                        if block.code.count(old) != 1:
                            raise ValueError(f"README.md:{start}: shrink text {old!r} must occur once in the block")
                        block.shrink.append((old, new))
                    else:
                        raise ValueError(f"README.md:{start}: unknown readme-test word {word!r}")
            blocks.append(block)
        i = j + 1
    return blocks


BLOCKS = python_blocks(README.read_text())
NAMED = {b.name: b for b in BLOCKS if b.name}


def program(block: Block) -> str:
    """The block preceded by the blocks it runs after (recursively), as one script."""
    parts, seen = [], set()

    def add(b: Block):
        for name in b.after:
            if name not in NAMED:
                raise KeyError(f"{b.id}: after={name} names no block")
            if name not in seen:
                seen.add(name)
                add(NAMED[name])
        parts.append(f"# --- {b.id}\n{b.code}")

    add(block)
    return "\n".join(parts) + "\n"


def needs_models(block: Block) -> bool:
    return "offline:" in program(block) or "from_pretrained(" in program(block)


def _undefined_names(source: str) -> set[str]:
    """Names loaded but never bound anywhere in the script (module level, imports, loops, functions, lambdas)."""
    tree = ast.parse(source)
    bound, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return used - bound


def test_readme_has_python_blocks_and_directives_resolve():
    assert len(BLOCKS) >= 5
    assert "api" in NAMED
    for b in BLOCKS:
        program(b)  # every after= names a block


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_block_defines_every_name_it_uses(block):
    """Static: compiles, and no name is used that neither the block nor its after= blocks define."""
    source = program(block)
    compile(source, block.id, "exec")
    assert not _undefined_names(source), f"{block.id} uses undefined names {sorted(_undefined_names(source))}"


def test_python_blocks_parser_finds_indented_blocks_and_directives():
    text = "x\n<!-- readme-test: name=a -->\n```python\nA = 1\n```\n- item:\n  <!-- readme-test: after=a hub -->\n" \
           "  ```python\n  print(A)\n  ```\n```bash\nls\n```\n"
    a, b = python_blocks(text)
    assert (a.name, a.code, b.after, b.hub, b.code) == ("a", "A = 1", ["a"], True, "print(A)")


def test_shrink_replaces_its_text_once_and_refuses_text_the_block_lacks():
    (b,) = python_blocks("<!-- readme-test: shrink=n=100->n=8 -->\n```python\nf(n=100)\n```\n")
    assert (b.code, b.run_code) == ("f(n=100)", "f(n=8)")
    with pytest.raises(ValueError, match="must occur once"):
        python_blocks("<!-- readme-test: shrink=n=50->n=8 -->\n```python\nf(n=100)\n```\n")


def test_undefined_names_catches_the_old_five_lines():
    old = "import hf_vocabspec\ndrafter = hf_vocabspec.x(dtype=torch.bfloat16)\nout = t.generate(**inputs)\n"
    assert _undefined_names(old) == {"torch", "inputs", "t"}


def _closure(block: Block, named: dict[str, Block] = NAMED) -> list[Block]:
    """The block and every block it runs after (recursively), in README order."""
    out, todo = {block.line: block}, [block]
    while todo:
        for name in todo.pop().after:
            if name not in named:
                raise KeyError(f"{block.id}: after={name} names no block")
            if named[name].line not in out:
                out[named[name].line] = named[name]
                todo.append(named[name])
    return [out[k] for k in sorted(out)]


@dataclass
class Chain:
    """Blocks that run in one process, in README order, as a reader runs them: a block without ``after=`` and
    every block whose earliest such ancestor it is (the setup block runs once, not once per block after it)."""

    blocks: list[Block]

    @property
    def id(self) -> str:
        return self.blocks[0].id

    @property
    def hub(self) -> bool:
        return any(b.hub for b in self.blocks)

    def script(self) -> str:
        """One script; before each block a line on stderr names it, so a failure names its block."""
        return "import sys as _readme_sys\n" + "\n".join(
            f"print('@@ {b.id}', file=_readme_sys.stderr, flush=True)\n# --- {b.id}\n{b.run_code}" for b in self.blocks) + "\n"


def chains(blocks: list[Block]) -> list[Chain]:
    groups: dict[int, dict[int, Block]] = {}
    named = {b.name: b for b in blocks if b.name}
    for b in blocks:
        closure = _closure(b, named)
        root = next(x for x in closure if not x.after)
        groups.setdefault(root.line, {}).update({x.line: x for x in closure})
    return [Chain([g[k] for k in sorted(g)]) for _, g in sorted(groups.items())]


CHAINS = chains(BLOCKS)


def test_every_block_runs_once_in_some_chain():
    """Every block is in exactly one chain, after every block it names (power: a block out of order is caught)."""
    seen = [b.line for c in CHAINS for b in c.blocks]
    assert sorted(seen) == sorted(b.line for b in BLOCKS) and len(seen) == len(set(seen))
    for c in CHAINS:
        lines = [b.line for b in c.blocks]
        assert lines == sorted(lines)
        for b in c.blocks:
            assert {x.line for x in _closure(b)} <= set(lines[: lines.index(b.line) + 1])
    text = "<!-- readme-test: name=a -->\n```python\nA = 1\n```\n<!-- readme-test: after=a -->\n```python\nB = A\n```\n"
    (chain,) = chains(python_blocks(text))
    assert [b.code for b in chain.blocks] == ["A = 1", "B = A"]


def _run(chain: Chain, tmp_path: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "chain.py"
    script.write_text(chain.script())
    env = {**os.environ, **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
                          timeout=1800)


def _params():
    for c in CHAINS:
        marks = [pytest.mark.integration] if any(needs_models(b) for b in c.blocks) else []
        yield pytest.param(c, marks=marks, id=c.id)


@pytest.mark.parametrize("chain", list(_params()))
def test_blocks_run_in_a_fresh_process(chain, tmp_path):
    env = None
    if chain.hub:
        sys.path.insert(0, str(Path(__file__).parent))
        from hub_server import LocalHub, client_env

        with LocalHub() as hub:
            env = client_env(hub, tmp_path / "hf-cache")
            proc = _run(chain, tmp_path, env)
    else:
        proc = _run(chain, tmp_path)
    failed = [line[3:] for line in proc.stderr.splitlines() if line.startswith("@@ ")]
    assert proc.returncode == 0, f"{failed[-1] if failed else chain.id} failed:\n{proc.stderr[-4000:]}"
