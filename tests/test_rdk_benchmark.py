"""RDK benchmark report: rows, ratios to the untrimmed drafter, markdown and PNG from a results dict."""

from __future__ import annotations

from hf_vocabspec.evaluation.benchmark import MethodResult
from hf_vocabspec.evaluation.rdk_benchmark import (
    _gen_row,
    format_rdk_report,
    plot_rdk_report,
)
from hf_vocabspec.generation import SpeculationStats


def test_rows_ratios_table_and_plot(tmp_path):
    base = MethodResult("untrimmed", new_tokens=100, seconds=10.0, stats=SpeculationStats(rounds=20, proposed=100, accepted=80))
    pruned = MethodResult("vanilla", new_tokens=100, seconds=12.5,
                          stats=SpeculationStats(rounds=25, proposed=125, accepted=75, pruned_proposed=3))
    row = _gen_row(pruned, base)
    assert row["tau"] == 4.0 and base.mean_accepted_length == 5.0
    assert row["tau_vs_untrimmed"] == 0.8 and row["tokens_per_s_vs_untrimmed"] == 0.8
    assert row["acceptance"] == 0.6 and row["pruned_proposed"] == 3
    rows = [{"method": "untrimmed", "level": 0.0, "kept": 1000, "coverage_eval": 1.0, "expected_acceptance": None,
             **_gen_row(base, base)}]
    for method, exp in (("vanilla", 0.9), ("RDK fitted", 0.91), ("RDK prior", 0.85)):
        for level, kept in ((0.9, 100), (0.97, 30)):
            rows.append({"method": method, "level": level, "kept": kept, "coverage_eval": 0.9,
                         "expected_acceptance": exp, **row})
    report = {"config": {"target": "tiny", "max_new_tokens": 10, "repeats": 1}, "prompts": 2,
              "runs": [{"temperature": 1.0, "rows": rows}, {"temperature": 0.7, "rows": rows}]}
    md = format_rdk_report(report)
    assert "| 97% | 30 | 90.0% | RDK fitted | 91.0% | 4.80 | 60.0% | 4.00 | 0.800 | 0.80 | 3 |" in md
    assert md.count("Temperature") == 2
    plot_rdk_report(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_a_small_dataset_splits_its_held_out_part_or_is_refused_in_one_line(cli_model, tmp_path):
    """A held-out part of 3000 or fewer conversations went whole to calibration and crashed on the empty rest
    (IndexError, #38: README's `hf-vocabspec rdk-bench` on a local chats file); now half of it calibrates, and a
    held-out part too small to split is refused naming the fix."""
    import json

    import pytest

    from hf_vocabspec.evaluation.rdk_benchmark import RDKBenchConfig, run_rdk_benchmark

    model, chats = cli_model
    five = tmp_path / "five.jsonl"
    five.write_text("".join(line + "\n" for line in chats.read_text().splitlines()[:5]), encoding="utf-8")
    cfg = dict(target=str(model), drafter_dtype="float32", levels=(0.9,), temperatures=(1.0,), count_examples=20,
               calibration_sequences=2, score_sequences=2, prompts=1, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"1 conversation\(s\) held out after the 4 counted.*more conversations"):
        run_rdk_benchmark(RDKBenchConfig(dataset=str(five), **cfg), tmp_path / "refused")
    run_rdk_benchmark(RDKBenchConfig(dataset=str(chats), **cfg), tmp_path / "ran")  # 10 held out: 5 + 5
    report = json.loads((tmp_path / "ran" / "results.json").read_text())
    assert report["prompts"] == 1 and report["runs"] and report["runs"][0]["rows"]
