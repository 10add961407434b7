"""Issue #38: `hf-vocabspec --help` and every `hf-vocabspec <command> --help` answer without importing torch or
transformers (they took 7-9 s), started both ways the command starts (console script, python -m hf_vocabspec.cli);
a command that runs still gets the transformers hooks, and `import hf_vocabspec` still installs them at once.

Asserted on what was imported (python -X importtime), never on wall time: a test must not need a quiet machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vocabspec.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "numpy", "datasets", "optuna", "matplotlib", "accelerate")


def _commands() -> list[str]:
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def imported_heavy(importtime_stderr: str) -> list[str]:
    """Top-level packages among HEAVY that ``python -X importtime`` reports imported."""
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in importtime_stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    return sorted(n for n in HEAVY if n in names)


def console_script(tmp_path: Path) -> Path:
    """The script pip writes for ``hf-vocabspec = "hf_vocabspec.cli:main"`` (same lines), under that name."""
    script = tmp_path / "bin" / "hf-vocabspec"
    script.parent.mkdir(exist_ok=True)
    script.write_text("import sys\nfrom hf_vocabspec.cli import main\nif __name__ == '__main__':\n"
                      "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit(main())\n")
    return script


def test_importtime_reader_has_power():
    sample = ("import time: self [us] | cumulative | imported package\n"
              "import time:       120 |        120 |   torch._C\n"
              "import time:        80 |         80 | hf_vocabspec.cli\n")
    assert imported_heavy(sample) == ["torch"]
    assert imported_heavy(sample.replace("torch._C", "torchvision_like")) == []


@pytest.mark.parametrize("start", ["module", "console-script"])
def test_every_help_imports_neither_torch_nor_transformers(tmp_path, start):
    commands = _commands()
    assert {"bench", "count", "trim", "rdk-fit", "tune", "lm-eval"} <= set(commands)
    entry = ["-m", "hf_vocabspec.cli"] if start == "module" else [str(console_script(tmp_path))]
    for argv in ([], *([c] for c in commands)):
        proc = subprocess.run([sys.executable, "-X", "importtime", *entry, *argv, "--help"], capture_output=True,
                              text=True, check=False, timeout=300, cwd=tmp_path, env=_env())
        shown = " ".join(["hf-vocabspec", *argv, "--help"])
        assert proc.returncode == 0, f"{shown}: {proc.stderr[-1500:]}"
        assert "usage: hf-vocabspec" in proc.stdout, shown
        assert imported_heavy(proc.stderr) == [], f"{shown} imported {imported_heavy(proc.stderr)}"


def test_a_bad_command_line_is_refused_before_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hf_vocabspec.cli", "trim", "--min-coverage", "2"],
                          capture_output=True, text=True, check=False, timeout=300, cwd=tmp_path, env=_env())
    assert proc.returncode == 2 and "--min-coverage: must be in (0, 1]" in proc.stderr
    assert imported_heavy(proc.stderr) == []


RUN = """
import json, sys
sys.argv[0] = {script!r}  # as the console script starts: the package defers its hooks past argparse
from hf_vocabspec.cli import main
deferred = "transformers" not in sys.modules and "torch" not in sys.modules
rc = main({argv!r})
from transformers import GenerationMixin
from hf_vocabspec.generation import hooks
print("RESULT" + json.dumps({{"deferred": deferred, "rc": rc,
      "hooked": GenerationMixin._assisted_decoding is not hooks._ORIGINALS.get("_assisted_decoding", GenerationMixin._assisted_decoding)
                and bool(hooks._ORIGINALS)}}))
"""


def test_a_command_started_as_the_console_script_runs_with_the_hooks(tmp_path, cli_model):
    model, chats = cli_model
    code = RUN.format(script=str(console_script(tmp_path)), argv=[
        "count", "--tokenizer", str(model), "--dataset", str(chats), "--output", str(tmp_path / "c.safetensors")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300,
                          cwd=tmp_path, env=_env())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stderr[-2000:]
    assert json.loads(line[len("RESULT"):]) == {"deferred": True, "rc": 0, "hooked": True}
    assert (tmp_path / "c.safetensors").is_file()


def test_import_hf_vocabspec_still_installs_the_hooks_at_once(tmp_path):
    code = ("import sys, hf_vocabspec; assert 'transformers' in sys.modules; "
            "from hf_vocabspec.generation import hooks; from transformers import GenerationMixin, AutoConfig; "
            "assert hooks._ORIGINALS and GenerationMixin._assisted_decoding is not hooks._ORIGINALS['_assisted_decoding']; "
            "assert AutoConfig.for_model('hf_vocabspec_trimmed_drafter').__class__.__name__ == 'TrimmedDrafterConfig'; "
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300,
                          cwd=tmp_path, env=_env())
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
