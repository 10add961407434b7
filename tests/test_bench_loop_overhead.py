"""scripts/bench_loop_overhead.py --quick runs and prints its table (issue #36's microbench, in-process: seconds)."""

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
