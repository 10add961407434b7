"""The command line (hf_vocabspec.cli). Startup: `hf-vocabspec --help` and every `hf-vocabspec <command> --help`
answer without importing torch or transformers (they took 7-9 s), started both ways the command starts (console
script, python -m hf_vocabspec.cli); a command that runs still gets the transformers hooks, and `import hf_vocabspec` still installs them at once.

Asserted on what was imported (python -X importtime), never on wall time: a test must not need a quiet machine.

Bad input: every option checked before any model, dataset or folder is touched, in ONE line that names the fix
(exit 2 for usage, 1 later; --debug shows the traceback); outputs never delete or overwrite what the command did not
write; a run that fails later leaves no empty folders."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny import llama_config
from transformers import LlamaForCausalLM

from hf_vocabspec import TokenCounts, TrimmedDrafter, tokenizer_sha256
from hf_vocabspec.cli import build_parser, main
from hf_vocabspec.evaluation.offline import load_model

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


# --- bad input: one line naming the fix, before any work; outputs we did not write are never touched ---------
def run_cli(capsys, *argv) -> tuple[int, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    return rc, err


def _last_line(err: str) -> str:
    return [ln for ln in err.strip().splitlines() if ln.strip()][-1]


@pytest.mark.parametrize(("argv", "needle"), [
    (["trim", "--min-coverage", "1.5"], "--min-coverage: must be in (0, 1]"),
    (["select", "--counts", "c", "--min-coverage", "0"], "--min-coverage: must be in (0, 1]"),
    (["trim", "--min-coverage", "abc"], "expected a number in (0, 1]"),
    (["count", "--max-examples", "0"], "--max-examples: must be a positive integer"),
    (["trim", "--max-examples", "-3"], "--max-examples: must be a positive integer"),
    (["trim", "--k", "0"], "--k: must be a positive integer"),
    (["select"], "the following arguments are required: --counts"),
    (["trim", "--private"], "only apply with --push-to-hub"),
    (["count", "--output", "/nonexistent-dir-xyz/counts.safetensors"], "does not exist"),
])
def test_usage_errors_are_one_line_exit_2_before_any_work(capsys, monkeypatch, argv, needle):
    import hf_vocabspec.cli._common as common

    monkeypatch.setattr(common, "count_for_args", lambda args: pytest.fail("worked before checking the arguments"))
    rc, err = run_cli(capsys, *argv)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


def test_every_option_has_help_with_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, p in sub.choices.items():
        assert isinstance(p.formatter_class, type) and issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
        missing += [f"{name} {a.option_strings[0]}" for a in p._actions
                    if a.option_strings and a.option_strings[0] != "-h" and not a.help]
    assert not missing
    assert "(default: 5000)" in " ".join(sub.choices["trim"].format_help().split())


def test_later_errors_are_one_line_and_debug_shows_the_traceback(capsys, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    rc, err = run_cli(capsys, "count", "--dataset", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "c"))
    assert rc == 1 and "is empty" in err and "Traceback" not in err and "--debug" in err
    with pytest.raises(ValueError, match="is empty"):
        main(["--debug", "count", "--dataset", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "c")])


def test_cli_process_exit_code_and_single_line(tmp_path):
    """The real entry point in a fresh process: one line on stderr, exit 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "hf_vocabspec.cli", "trim", "--min-coverage", "2"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("name", ["chats.jsonl", "chats.json", "chats.jsonl.gz", "chats.csv"])
def test_a_chat_file_that_is_not_utf8_is_named_with_its_fix(capsys, cli_model, tmp_path, name):
    """Issue #38: latin-1 bytes gave "'utf-8' codec can't decode byte 0xe9 in position 3" with no file and no fix
    (datasets' JSON reader loads the bytes and fails only when a row is read). `count` through the CLI: one line naming
    the file, the byte, its offset and line, and the iconv command; exit 1, no traceback."""
    import gzip

    model, _ = cli_model
    good = '{"messages": [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7 w8"}]}\n'
    bad = '{"messages": [{"role": "user", "content": "caf\u00e9"}, {"role": "assistant", "content": "w7"}]}\n'
    text = (good + bad).encode("latin-1")
    if name.endswith(".csv"):
        text = "messages\nw5 w6\ncaf\u00e9\n".encode("latin-1")
    data = tmp_path / name
    data.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    offset = text.index(b"\xe9")
    rc, err = run_cli(capsys, "count", "--tokenizer", str(model), "--dataset", str(data),
                      "--output", str(tmp_path / "counts.safetensors"))
    assert rc == 1 and "Traceback" not in err
    line = _last_line(err)
    assert f"Dataset file {str(data)!r} is not UTF-8 (byte 0xe9 at offset {offset}" in line
    lineno = text[:offset].count(b"\n") + 1
    assert f"line {lineno})" in line and "iconv -f latin1 -t utf-8" in line
    assert not (tmp_path / "counts.safetensors").exists()


def test_select_refuses_other_tokenizer_before_loading_or_timing(capsys, monkeypatch, tmp_path, counts_file,
                                                                 same_size_other_tok):
    from hf_vocabspec import cost
    from hf_vocabspec.evaluation import offline

    same_size_other_tok.save_pretrained(tmp_path / "other-tok")
    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    monkeypatch.setattr(cost, "measure_draft_latency", lambda *a, **k: pytest.fail("timed before the check"))
    for cmd in (["select", "--counts", str(counts_file), "--drafter", str(tmp_path / "other-tok")],
                ["trim", "--counts", str(counts_file), "--drafter", str(tmp_path / "other-tok")]):
        rc, err = run_cli(capsys, *cmd, "--output", str(tmp_path / "out"))
        assert rc == 1 and "fingerprints differ" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()


def test_unreachable_coverage_refused_before_timing_and_leaves_no_folder(capsys, monkeypatch, tmp_path, counts_file):
    from hf_vocabspec.evaluation import offline

    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    counts = TokenCounts.load(counts_file)
    flat = TokenCounts(torch.ones_like(counts.counts), 1, 1, counts.tokenizer_name, counts.tokenizer_sha256)
    flat.save(tmp_path / "flat.safetensors")  # every token once: the top 50 cover 50/49,152
    rc, err = run_cli(capsys, "select", "--counts", str(tmp_path / "flat.safetensors"), "--min-coverage", "0.99",
                      "--max-k", "50", "--output", str(tmp_path / "sel"))
    assert rc == 2 and "unreachable" in err and "best reachable coverage" in err
    assert not (tmp_path / "sel").exists()


def test_missing_counts_file_and_drafter_dir(capsys, tmp_path):
    rc, err = run_cli(capsys, "select", "--counts", str(tmp_path / "missing.safetensors"))
    assert rc == 1 and "No such counts file" in err and len(err.strip().splitlines()) == 1
    rc, err = run_cli(capsys, "rdk-fit", "./no-such-drafter")
    assert rc == 1 and "No such drafter directory: './no-such-drafter'" in err and "Repo id" not in err


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders): equal trees = nothing created, changed or deleted."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command loads a model, a dataset or counts anything."""
    import hf_vocabspec.cli._common as common
    from hf_vocabspec.evaluation import offline

    def fail(*a, **k):
        pytest.fail("loaded a model/dataset before the command line was known to be valid")

    monkeypatch.setattr(offline, "load_model", fail)
    monkeypatch.setattr(offline, "load_chat_dataset", fail)
    monkeypatch.setattr(common, "count_for_args", fail)


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "results.txt").write_text("not JSON")
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes")
    (folder / "src" / "main.py").write_text("print('mine')")
    return folder


def test_trim_refuses_an_output_folder_it_did_not_write(capsys, no_loading, user_folder, tmp_path):
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "trim", "--k", "100", "--output", str(user_folder))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "not an earlier hf-vocabspec drafter output" in err and "notes.txt" in err and "--overwrite" in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("argv", [
    ["trim", "--k", "100"], ["select", "--counts", "c.safetensors"], ["bench"], ["acceptance"], ["tune"],
    ["demo"], ["rdk-bench"], ["distill"], ["rdk-fit", "d", "--output"],
])
def test_output_naming_a_regular_file_is_refused(capsys, no_loading, tmp_path, argv):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    before = _tree(tmp_path)
    if argv[-1] != "--output":
        argv = [*argv, "--output"]
    rc, err = run_cli(capsys, *argv, str(existing))
    assert rc == 2 and "is a file, not a folder" in err and len(err.strip().splitlines()) == 1, err
    assert _tree(tmp_path) == before


def test_count_output_must_be_a_counts_file_or_new(capsys, no_loading, tmp_path, counts_file):
    other = tmp_path / "data.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "count", "--output", str(other))
    assert rc == 2 and "is not an hf-vocabspec counts file" in err and "--overwrite" in err, err
    rc, err = run_cli(capsys, "count", "--output", str(tmp_path))
    assert rc == 2 and "is a folder" in err, err
    assert _tree(tmp_path) == before
    from hf_vocabspec.cli._common import prepare_output

    assert prepare_output(str(counts_file), "counts") == counts_file  # our own earlier counts: replaced atomically
    assert prepare_output(str(other), "counts", overwrite=True) == other


def test_trim_k_beyond_the_vocabulary_is_refused_before_loading(capsys, no_loading, tmp_path, counts_file):
    for extra in ([], ["--counts", str(counts_file)]):
        rc, err = run_cli(capsys, "trim", "--k", "100000", *extra, "--output", str(tmp_path / "out"))
        assert rc == 2 and "--k 100000 is beyond the vocabulary (49,152 tokens)" in err, err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "needle"), [
    (["--counts", "C", "--dataset", "offline:sharegpt"], "--counts and --dataset contradict"),
    (["--counts", "C", "--max-examples", "10"], "--counts and --max-examples contradict"),
    (["--k", "3000", "--min-coverage", "0.99"], "--k and --min-coverage contradict"),
    (["--k", "3000", "--n-trials", "5", "--objective", "utility"], "--k and --objective, --n-trials contradict"),
])
def test_trim_contradictions_are_refused(capsys, no_loading, tmp_path, argv, needle):
    rc, err = run_cli(capsys, "trim", *argv, "--output", str(tmp_path / "out"))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_trim_target_of_another_tokenizer_is_refused_before_work(capsys, no_loading, tmp_path, same_size_other_tok):
    same_size_other_tok.save_pretrained(tmp_path / "other-target")
    rc, err = run_cli(capsys, "trim", "--k", "100", "--target", str(tmp_path / "other-target"),
                      "--output", str(tmp_path / "out"))
    assert rc == 2 and "uses another tokenizer than the drafter" in err and "fingerprints differ" in err, err
    assert not (tmp_path / "out").exists()


# every option of every command is checked before any model, dataset or folder is touched
SMOL = "offline:smollm2-135m-instruct"


REFUSED = [
    ("count", ["--max-examples", "0"]),
    ("count", ["--dataset", "./no/such/file.jsonl"]),
    ("trim", ["--k", "100000"]),
    ("trim", ["--k", "10", "--min-coverage", "0.9"]),
    ("select", ["--counts", "c", "--n-trials", "0"]),
    ("rdk-fit", ["d", "--temperature", "0"]),
    ("rdk-fit", ["d", "--method", "prior", "--sequences", "5"]),
    ("demo", ["--prompts", "0"]),
    ("demo", ["--min-coverage", "1.5"]),
    ("bench", ["--coverages", "1.5"]),
    ("bench", ["--prompts", "0"]),
    ("bench", ["--max-new-tokens", "0"]),
    ("bench", ["--repeats", "0"]),
    ("bench", ["--target", SMOL, "--ks", "100000"]),
    ("bench", ["--coverages"]),
    ("bench", ["--workloads", "./no/such.jsonl"]),
    ("acceptance", ["--conversations", "0"]),
    ("acceptance", ["--levels", "1.0"]),
    ("acceptance", ["--temperatures", "0"]),
    ("rdk-bench", ["--score-sequences", "0"]),
    ("rdk-bench", ["--no-generate", "--prompts", "5"]),
    ("distill", ["--num-layers", "0"]),
    ("distill", ["--lr", "-1"]),
    ("tune", ["--draft-lengths", "0"]),
    ("tune", ["--mode", "t-1"]),
    ("tune", ["--mode", "hot"]),
    ("tune", ["--coverages", "1.5"]),
    ("tune", ["--conversations", "0"]),
    ("tune", ["--target", SMOL, "--ks", "100000"]),
    ("tune", ["--ks", "100", "--coverages", "0.9"]),
    ("tune", ["--validate-on", "scored"]),
    ("tune", ["--storage", "results.txt/study.journal"]),
    ("select", ["--counts", "c", "--storage", "."]),
    ("select", ["--counts", "c", "--max-k", "10"]),
    ("trim", ["--max-k", "10"]),
    ("bench", ["--target", "./no/such/model"]),
    ("acceptance", ["--target", "offline:no-such-model"]),
    ("tune", ["--drafter", "results.txt"]),
    ("rdk-bench", ["--target", "./no/such/model"]),
    ("distill", ["--target", "./no/such/model"]),
    ("trim", ["--k", "10", "--push-to-hub", "u/r", "--bench-results", "results.txt"]),
    ("lm-eval", ["run", "--model", "hf-vocabspec", "--model_args", "pretrained=./no/such/model", "--tasks", "x"]),
    ("lm-eval", ["run", "--model", "hf-vocabspec", "--model_args", "drafter=d", "--tasks", "x"]),
]


@pytest.mark.parametrize(("command", "argv"), REFUSED, ids=[f"{c} {' '.join(a)}" for c, a in REFUSED])
@pytest.mark.parametrize("output", ["default", "given"])
def test_nothing_is_created_or_deleted_when_a_command_is_refused(capsys, monkeypatch, no_loading, tmp_path,
                                                                 user_folder, command, argv, output):
    monkeypatch.chdir(tmp_path)
    if output == "given":
        argv = [*argv, "--output", str(tmp_path / "out" / "run")]
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, command, *argv)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert _tree(tmp_path) == before


def test_every_command_is_covered_by_the_refusal_test():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) <= {c for c, _ in REFUSED}


def test_unreadable_datasets_name_the_file_the_line_and_the_format(capsys, tmp_path):
    ok = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    (tmp_path / "notjson.json").write_text("hello world\n")
    (tmp_path / "broken.jsonl").write_text(f"{ok}\n{ok}\n{{\"messages\": [broken\n{ok}\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "readme.txt").write_text("hi")
    cases = [("notjson.json", "line 1"), ("broken.jsonl", "line 3"), ("folder", "holds no .json/.jsonl")]
    for name, where in cases:
        rc, err = run_cli(capsys, "count", "--dataset", str(tmp_path / name), "--output", str(tmp_path / "c.safetensors"))
        line = _last_line(err)  # (after datasets' progress bar, which a terminal overwrites)
        assert rc == 1 and "Traceback" not in err and "Failed to load JSON" not in err, err
        assert str(tmp_path / name) in line and where in line and "'messages' list" in line, err
        assert "An error occurred while generating" not in err
    assert not (tmp_path / "c.safetensors").exists()


def test_drafter_of_another_tokenizer_is_refused_before_loading(capsys, no_loading, tmp_path, same_size_other_tok):
    same_size_other_tok.save_pretrained(tmp_path / "other")
    for command in ("bench", "tune", "demo"):
        rc, err = run_cli(capsys, command, "--target", SMOL, "--drafter", str(tmp_path / "other"),
                          "--output", str(tmp_path / "out"))
        assert rc == 2 and "--drafter" in err and "fingerprints differ" in err, err
        assert not (tmp_path / "out").exists()


def test_a_run_that_fails_later_leaves_no_empty_folders(capsys, monkeypatch, tmp_path):
    """Found after the checks (a model that cannot be loaded): the folders made for --output are removed again."""
    from hf_vocabspec.evaluation import offline

    def broken(*a, **k):
        raise OSError("cannot load this model")

    monkeypatch.setattr(offline, "load_model", broken)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(150)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "acceptance", "--target", SMOL, "--dataset", str(tmp_path / "chat.jsonl"),
                      "--count-examples", "20", "--output", str(tmp_path / "results" / "acceptance"))
    assert rc == 1 and "cannot load this model" in _last_line(err), err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(("command", "argv", "needle"), [
    ("tune", ["--mode", "t1", "--confidence-thresholds", "0.3", "0.5"], "--confidence-thresholds and --mode t1 contradict"),
    ("tune", ["--acceptance", "ideal", "--confidence-thresholds", "0.3"],
     "--confidence-thresholds and --acceptance ideal contradict"),
    ("bench", ["--batched-speculation", "off"], "--batched-speculation only applies with --batch-sizes"),
    ("bench", ["--batch-sizes", "2", "--ks", "5000"], "--batch-sizes and --ks contradict"),
    ("bench", ["--batch-sizes", "2", "--coverages", "0.9", "0.95"], "--batch-sizes and 2 --coverages contradict"),
    ("bench", ["--batch-sizes", "2", "--modes", "t1"], "--batch-sizes and --modes contradict"),
])
def test_options_a_command_cannot_honour_are_refused_naming_the_conflict(capsys, no_loading, tmp_path, command, argv,
                                                                         needle):
    rc, err = run_cli(capsys, command, *argv, "--output", str(tmp_path / "out"))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_tune_thresholds_default_with_sampling_is_not_refused(capsys, monkeypatch, tmp_path):
    """Only TYPED thresholds conflict: the default list with --mode t1 runs (reduced to 0 by the model, as documented)."""
    import hf_vocabspec.cli.tune as tune_cli

    monkeypatch.setattr(tune_cli, "_run", lambda args, out, tqdm: pytest.fail("reached the run") or {})
    monkeypatch.setattr("hf_vocabspec.cli.evaluation.check_drafter_tokenizer", lambda args: None)
    with pytest.raises(pytest.fail.Exception, match="reached the run"):
        main(["tune", "--target", SMOL, "--mode", "t1", "--output", str(tmp_path / "out")])


def test_tune_compile_draft_step_reaches_the_run(capsys, monkeypatch, tmp_path):
    """--compile-draft-step is passed on to run_tune (which times and validates the steps compiled), off by default."""
    import hf_vocabspec.evaluation.tune as tune_eval

    seen = []
    monkeypatch.setattr(tune_eval, "run_tune", lambda *a, **k: seen.append(k["compile_draft_step"]) or {})
    monkeypatch.setattr(tune_eval, "format_tune", lambda report: "")
    monkeypatch.setattr("hf_vocabspec.cli.evaluation.check_drafter_tokenizer", lambda args: None)
    for extra in ([], ["--compile-draft-step"]):
        rc, err = run_cli(capsys, "tune", "--target", SMOL, "--output", str(tmp_path / f"out{len(extra)}"), *extra)
        assert rc == 0, err
    assert seen == [False, True]


def test_bench_honours_ks_and_coverages_together(capsys, monkeypatch, tmp_path):
    from hf_vocabspec.evaluation import benchmark

    seen = {}
    monkeypatch.setattr(benchmark, "run_benchmark", lambda cfg, out, progress=None: seen.setdefault("cfg", cfg) and {})
    monkeypatch.setattr(benchmark, "format_report", lambda report: "")
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--ks", "5000", "--coverages", "0.9",
                      "--output", str(tmp_path / "out"))
    assert rc == 0, err
    assert seen["cfg"].ks == (5000,) and seen["cfg"].coverages == (0.9,)  # both trimmed (benchmark: sizes = both)


def test_bench_compile_draft_step_reaches_both_benches(capsys, monkeypatch, tmp_path):
    """--compile-draft-step is read by the plain bench (a 'compiled steps' row per trimmed k) and by the batched
    one (its trimmed rows compiled): neither ignores it."""
    from hf_vocabspec.evaluation import batch_bench, benchmark

    seen = {}
    monkeypatch.setattr(benchmark, "run_benchmark", lambda cfg, out, progress=None: seen.setdefault("plain", cfg) and {})
    monkeypatch.setattr(benchmark, "format_report", lambda report: "")
    monkeypatch.setattr(batch_bench, "run_batch_bench", lambda cfg, out, progress=None: seen.setdefault("batch", cfg))
    monkeypatch.setattr(batch_bench, "format_batch_report", lambda report: "")
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--compile-draft-step", "--output", str(tmp_path / "a"))
    assert rc == 0, err
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--compile-draft-step", "--batch-sizes", "2",
                      "--coverages", "0.95", "--output", str(tmp_path / "b"))
    assert rc == 0, err
    assert seen["plain"].compile_draft_step and seen["batch"].compile_draft_step
    assert not benchmark.BenchConfig().compile_draft_step and not batch_bench.BatchBenchConfig().compile_draft_step


def test_bench_weight_quantization_reaches_both_benches(capsys, monkeypatch, tmp_path):
    """--weight-quantization int8 reaches the plain bench and the batched one ('none', the default: None)."""
    from hf_vocabspec.evaluation import batch_bench, benchmark

    seen, report_of = {}, batch_bench.format_batch_report
    monkeypatch.setattr(benchmark, "run_benchmark", lambda cfg, out, progress=None: seen.setdefault("plain", cfg) and {})
    monkeypatch.setattr(benchmark, "format_report", lambda report: "")
    monkeypatch.setattr(batch_bench, "run_batch_bench", lambda cfg, out, progress=None: seen.setdefault("batch", cfg))
    monkeypatch.setattr(batch_bench, "format_batch_report", lambda report: "")
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--weight-quantization", "int8", "--output", str(tmp_path / "a"))
    assert rc == 0, err
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--weight-quantization", "int4", "--batch-sizes", "2",
                      "--coverages", "0.95", "--output", str(tmp_path / "b"))
    assert rc == 0, err
    assert seen["plain"].weight_quantization == "int8" and seen["batch"].weight_quantization == "int4"
    seen.clear()
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--output", str(tmp_path / "c"))
    assert rc == 0 and seen["plain"].weight_quantization is None, err
    assert batch_bench.BatchBenchConfig().weight_quantization is None
    from hf_vocabspec.cli._common import WEIGHT_QUANTIZATION_CHOICES
    from hf_vocabspec.configuration import WEIGHT_QUANTIZATIONS
    assert WEIGHT_QUANTIZATION_CHOICES == ("none", *WEIGHT_QUANTIZATIONS)  # the parser's literal copy of the fact
    header = report_of({
        "machine": {"cpu": "x", "cpu_count": 2, "torch_threads": 2, "torch": "t", "transformers": "v", "date": "d"},
        "config": {**vars(batch_bench.BatchBenchConfig(target="T", weight_quantization="int8", compile_draft_step=True))},
        "kept_vocab": 10, "full_vocab": 20, "draft_length": 5, "runs": []}).splitlines()[0]
    assert "bfloat16 (int8 weights, steps compiled) trimmed to k=10" in header, header


def test_select_refuses_counts_of_special_tokens_only(capsys, no_loading, tmp_path, tok):
    special = torch.tensor(sorted(set(tok.all_special_ids)))
    counts = torch.zeros(len(tok), dtype=torch.int64)
    counts[special] = 7
    TokenCounts(counts, 5, 5, tok.name_or_path, tokenizer_sha256(tok)).save(tmp_path / "special.safetensors")
    for command in ("select", "trim"):
        rc, err = run_cli(capsys, command, "--counts", str(tmp_path / "special.safetensors"),
                          "--output", str(tmp_path / "out"))
        assert rc == 2 and "hold only special tokens" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()


def test_unwritable_outputs_are_refused_before_any_work(capsys, no_loading, tmp_path, unwritable, saved):
    capsys.readouterr()  # the fixture's save progress bar
    for argv in (["count", "--output", str(unwritable / "counts.safetensors")],
                 ["trim", "--k", "100", "--output", str(unwritable / "drafter")],
                 ["bench", "--output", str(unwritable / "bench")]):
        rc, err = run_cli(capsys, *argv)
        assert rc == 2 and "cannot write in" in err and "choose a folder you can write" in err, err
        assert len(err.strip().splitlines()) == 1 and ".tmp-" not in err, err
    drafter, _ = saved
    with pytest.raises(OSError, match="is not writable .*choose a folder you can write") as err:
        drafter.save_pretrained(unwritable / "drafter")
    assert ".tmp-" not in str(err.value)


def test_messages_name_a_fix_that_exists(tmp_path, counts_file, capsys):
    with pytest.raises(ValueError, match="counts go to `hf-vocabspec select --counts` or `trim --counts`"):
        load_model(str(counts_file))
    rc, err = run_cli(capsys, "bench", "--target", str(counts_file), "--output", str(tmp_path / "out"))
    assert rc == 2 and "pass it as --counts" not in err and "select --counts" in err, err
    LlamaForCausalLM(llama_config()).save_pretrained(tmp_path / "plain")
    with pytest.raises(OSError, match="it is a plain model; trim it first .*hf-vocabspec trim --drafter") as err:
        TrimmedDrafter.from_pretrained(tmp_path / "plain")
    assert "copy or download" not in str(err.value)


def test_trim_keeping_the_whole_vocabulary_runs_and_reports_1x(capsys, cli_model, tmp_path):
    """#38: `trim --k <vocabulary size>` (or a search that picks the whole head, as a noisy measured curve can on a
    small model) saved the drafter, then crashed with 'list index out of range': the latency measurement of the
    trimmed and the full head had one size for both."""
    model, chats = cli_model
    rc, err = run_cli(capsys, "trim", "--drafter", str(model), "--dataset", str(chats), "--k", "64", "--dtype",
                      "float32", "--compile-draft-step", "--output", str(tmp_path / "whole"))
    assert rc == 0, err
    # --compile-draft-step: saved on with the drafter (generate then compiles its steps); off without the flag
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["compile_draft_step"] is True
    parse = build_parser().parse_args
    assert [parse(["trim", *extra]).compile_draft_step for extra in
            ([], ["--compile-draft-step"], ["--compile-draft-step", "auto"])] == ["off", "on", "auto"]



def test_drafter_dtype_auto_is_the_default_and_follows_the_hardware(capsys, cli_model, tmp_path, monkeypatch):
    """`--dtype auto` (the default of trim / select, `--drafter-dtype` of tune / bench) saves and times a bfloat16
    drafter where a CUDA GPU or a CPU with bf16 hardware runs it, else float32 (bf16 is emulated there: slower)."""
    import torch

    from hf_vocabspec import kernels
    from hf_vocabspec.cli._common import DTYPES

    parse = build_parser().parse_args
    assert parse(["trim"]).dtype == parse(["select", "--counts", "c"]).dtype == "auto"
    assert parse(["tune"]).drafter_dtype == parse(["bench"]).drafter_dtype == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, chats = cli_model
    for native, dtype in ((False, "float32"), (True, "bfloat16")):
        monkeypatch.setattr(kernels, "native_bf16", lambda native=native: native)
        assert DTYPES["auto"] is getattr(torch, dtype)
        out = tmp_path / dtype
        rc, err = run_cli(capsys, "trim", "--drafter", str(model), "--dataset", str(chats), "--k", "40",
                          "--output", str(out))
        assert rc == 0, err
        assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    # a GPU with bf16 picks bfloat16 whatever the CPU
    monkeypatch.setattr(kernels, "native_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert kernels.auto_drafter_dtype() is torch.bfloat16

def test_batch_bench_header_names_the_draft_length_rounds_of_several_rows_use():
    """The batched bench's header states the L its rounds of several rows draft (the drafter's L with a confidence
    stop is capped there), not the drafter's own L alone; without a stop the two agree."""
    from hf_vocabspec.configuration import CAPPED_DRAFT_LENGTH
    from hf_vocabspec.evaluation.batch_bench import format_batch_report

    machine = dict(cpu="cpu", cpu_count=2, torch_threads=2, torch="t", transformers="tf", date="d")
    config = dict(target="offline:gemma-3-270m", drafter_dtype="bfloat16", max_new_tokens=48, repeats=2)
    report = dict(machine=machine, config=config, kept_vocab=13_395, full_vocab=262_144, runs=[], draft_length=12,
                  confidence_threshold=0.4, batched_draft_length=CAPPED_DRAFT_LENGTH)
    header = format_batch_report(report).splitlines()[0]
    assert (f"L={CAPPED_DRAFT_LENGTH} at batch >= 3 (the drafter's L=12 with its confidence stop 0.4, capped; rounds of "
            "fewer rows draft L)") in header
    report.update(confidence_threshold=0.0, batched_draft_length=12)
    assert ", L=12, greedy" in format_batch_report(report).splitlines()[0]
