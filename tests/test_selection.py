"""Vocabulary selection: constraint, reproducibility, speed, resume, infeasible error, Pareto, plot."""

from __future__ import annotations

import json

import pytest
import torch

from hf_vocabspec.cost import LatencyCurve, speculative_speedup
from hf_vocabspec.coverage import TokenCounts
from hf_vocabspec.evaluation.plots import plot_pareto
from hf_vocabspec.selection import SelectionTrial, select_vocabulary

V = 5000


@pytest.fixture(scope="module")
def zipf():
    counts = (1e6 / torch.arange(1, V + 1).double() ** 1.1).long()
    return TokenCounts(counts[torch.randperm(V, generator=torch.Generator().manual_seed(0))], 100, 200, "zipf")


CURVE = LatencyCurve(ks=[500, 2000, V], seconds=[0.011, 0.013, 0.02], floor_seconds=0.010, vocab_size=V)


@pytest.mark.parametrize("objective", ["throughput", "utility"])
def test_constraint_reproducible(zipf, objective):
    a = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, objective=objective, n_trials=100, k_range=(50, V))
    b = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, objective=objective, n_trials=100, k_range=(50, V))
    assert a.k == b.k and a.trials == b.trials
    assert a.coverage >= 0.9 and a.coverage == zipf.coverage(a.k) and len(a.trials) == 100
    assert torch.equal(a.token_ids, zipf.top_k(a.k)) and a.cost_source.startswith("measured")
    assert [t[1] for t in a.trials[:2]] == [zipf.smallest_k_for_coverage(0.9), V]  # both ends anchored
    assert a.relative_draft_cost == pytest.approx(CURVE.predict(a.k) / CURVE.predict(V))
    assert a.predicted_draft_speedup == pytest.approx(1 / a.relative_draft_cost)
    # the chosen k is the best feasible trial
    feasible = [t for t in a.trials if t[2] >= 0.9]
    assert a.value == max(t[4] for t in feasible)
    if objective == "utility":
        assert a.value == pytest.approx(0.5 * a.coverage + 0.5 * (1 - a.relative_draft_cost))
    else:
        assert a.value == pytest.approx(speculative_speedup(0.98 * a.coverage, 5, 0.5 * a.relative_draft_cost))
        assert a.value == a.predicted_speedup
    c = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, objective=objective, n_trials=100, seed=7, k_range=(50, V))
    assert [t[1] for t in c.trials] != [t[1] for t in a.trials]  # the seed matters


def test_throughput_trims_harder_when_drafting_is_expensive(zipf):
    cheap = select_vocabulary(zipf, cost=CURVE, min_coverage=0.8, verify_cost_ratio=0.05, n_trials=60, k_range=(50, V))
    dear = select_vocabulary(zipf, cost=CURVE, min_coverage=0.8, verify_cost_ratio=0.9, n_trials=60, k_range=(50, V))
    assert dear.k < cheap.k


def test_flops_cost_from_config_and_callable(zipf):
    from tiny import llama_config

    res = select_vocabulary(zipf, llama_config(vocab_size=V), min_coverage=0.8, n_trials=20, k_range=(50, V))
    assert res.cost_source == "architecture-aware FLOPs" and res.coverage >= 0.8
    lin = select_vocabulary(zipf, cost=lambda k: 0.5 + 0.5 * k / V, min_coverage=0.8, n_trials=20, k_range=(50, V))
    assert lin.cost_source == "user-supplied cost function" and lin.relative_draft_cost == 0.5 + 0.5 * lin.k / V
    with pytest.raises(ValueError, match="cost="):
        select_vocabulary(zipf, min_coverage=0.8, n_trials=5)


def test_infeasible_constraint_names_best_reachable(zipf):
    best = zipf.coverage(100)
    with pytest.raises(ValueError, match=rf"best is {best:.2%} at k=100.*Lower min_coverage.*widen k_range to reach k="):
        select_vocabulary(zipf, cost=CURVE, min_coverage=0.99, n_trials=5, k_range=(50, 100))
    zipf_full = zipf.coverage(V)
    assert zipf_full == 1.0
    with pytest.raises(ValueError, match="objective"):
        select_vocabulary(zipf, cost=CURVE, objective="speed", n_trials=5)


def test_resume_loses_no_trial(tmp_path, zipf):
    journal = tmp_path / "study.log"
    first = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, n_trials=10, storage=journal, k_range=(50, V))
    second = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, n_trials=20, storage=journal, k_range=(50, V))
    assert len(first.trials) == 10 and len(second.trials) == 20
    assert [t[0] for t in second.trials] == list(range(20))  # 20 unique trials
    assert second.trials[:10] == first.trials  # the first 10 unchanged
    again = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, n_trials=20, storage=journal, k_range=(50, V))
    assert again.trials == second.trials  # already complete: nothing re-run
    assert first.study_name == second.study_name
    other = select_vocabulary(zipf, cost=CURVE, min_coverage=0.8, n_trials=3, storage=journal, k_range=(50, V))
    assert other.study_name != first.study_name and len(other.trials) == 3  # other settings: another study
    with pytest.raises(ValueError, match="other settings.*min_coverage"):
        select_vocabulary(zipf, cost=CURVE, min_coverage=0.8, n_trials=3, storage=journal, k_range=(50, V),
                          study_name=first.study_name)


def test_pareto_is_non_dominated_and_plot(tmp_path, zipf):
    res = select_vocabulary(zipf, cost=CURVE, min_coverage=0.9, n_trials=30, k_range=(50, V))
    front = res.pareto
    assert all(isinstance(t, SelectionTrial) for t in res.trials)  # a typed record, read by name
    everything = [(t.k, t.coverage, t.relative_cost) for t in res.trials] + res.sweep
    assert len(res.sweep) > 100 and len(front) > 10
    for k, c, r in front:
        assert not any((c2 >= c and r2 <= r) and (c2 > c or r2 < r) for _, c2, r2 in everything)
    for k, c, r in everything:  # every point off the front is dominated by (or equal to) a front point
        assert any(c2 >= c and r2 <= r for _, c2, r2 in front)
    plot_pareto(res, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads(json.dumps(res.to_dict()))
    assert d["k"] == res.k and d["token_ids"] == res.token_ids.tolist() and len(d["trials"]) == 30
    assert set(d["trials"][0]) == {"number", "k", "coverage", "relative_cost", "value"}  # the JSON keys are unchanged
    assert d["predicted_draft_speedup"] > 1
