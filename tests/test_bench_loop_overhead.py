"""scripts/bench_loop_overhead.py --quick runs and prints its table (issue #36's microbench, in-process: seconds),
and scripts/bench_cpu_compile.py on a tiny model."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_loop_overhead.py"


def test_quick_prints_the_table(capsys):
    spec = importlib.util.spec_from_file_location("bench_loop_overhead", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        bench.main(["--quick"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")]
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
