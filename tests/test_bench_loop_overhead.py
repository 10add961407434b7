"""scripts/bench_loop_overhead.py --quick runs and prints its table (issue #36's microbench, in-process: seconds),
and scripts/bench_cpu_compile.py on a tiny model."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_loop_overhead.py"


def _run(capsys, *args: str):
    """(the bench module, the table's rows) of one run."""
    spec = importlib.util.spec_from_file_location("bench_loop_overhead", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        bench.main(["--quick", *args])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    return bench, [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")], out


def test_quick_prints_the_table(capsys):
    bench, rows, out = _run(capsys)
    assert len(rows) == 2 and "| 1.00 |" in rows[0], out  # one host sync per round
    from hf_vocabspec.generation import draft_step, engine
    assert "wrapper" not in engine.SpeculativeEngine.run.__qualname__ + draft_step.DraftStep.logits.__qualname__
    # every draft accepted needs a drafter that computes what the target does: no int8 copies
    assert bench.tiny_pair("cpu")[1].use_int8_copies is False


def test_cpu_compile_bench_prints_its_table(cli_model, capsys):
    """scripts/bench_cpu_compile.py (Inductor against the eager fast linears, issue #36) on a tiny saved model:
    the three ways decode identical tokens and the table prints (a smoke test: one short repeat)."""
    spec = importlib.util.spec_from_file_location("bench_cpu_compile", SCRIPT.with_name("bench_cpu_compile.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--model", str(cli_model[0]), "--new-tokens", "3", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "the three outputs identical" in out and "| static cache + torch.compile (Inductor) |" in out, out


def test_checks_run_the_default_drafters_per_draft_checks_without_firing(capsys):
    """--checks: a confidence stop and an EOS id, as a default drafter's call has; neither fires (every round still
    drafts all L = 5, every draft accepted: the bench asserts it), and the stop's read per drafted position shows
    in the host syncs (1 + 5 per full round; without --checks: 1 per round)."""
    _, rows, out = _run(capsys, "--checks")
    assert len(rows) == 2 and "per-draft checks" in out, out
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        syncs, steps = float(cells[7].split()[0]), float(cells[8].split()[0])
        # (--quick's 32 tokens: the target's own first step (the drafter, the target's copy, takes its prompt cache),
        # 5 rounds of 5 drafts and the budget's last ones without: ~3.6 steps a round)
        assert steps >= 3.5 and syncs >= steps + 0.5, row
