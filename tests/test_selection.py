"""Vocabulary selection: constraint, reproducibility, speed, resume, infeasible error, Pareto, plot."""

from __future__ import annotations

import time

import pytest
import torch

from hf_vocabspec.cost import LatencyCurve
from hf_vocabspec.coverage import TokenCounts
from hf_vocabspec.selection import select_vocabulary

V = 5000


@pytest.fixture(scope="module")
def zipf():
    counts = (1e6 / torch.arange(1, V + 1).double() ** 1.1).long()
    return TokenCounts(counts[torch.randperm(V, generator=torch.Generator().manual_seed(0))], 100, 200, "zipf")


CURVE = LatencyCurve(ks=[500, 2000, V], seconds=[0.011, 0.013, 0.02], floor_seconds=0.010)


@pytest.mark.parametrize("objective", ["throughput", "utility"])
def test_constraint_reproducible_and_fast(zipf, objective):
    t0 = time.perf_counter()
    a = select_vocabulary(zipf, CURVE, min_coverage=0.9, objective=objective, n_trials=100, k_range=(50, V))
    assert time.perf_counter() - t0 < 30
    b = select_vocabulary(zipf, CURVE, min_coverage=0.9, objective=objective, n_trials=100, k_range=(50, V))
    assert a.k == b.k and [t[0] for t in a.trials] == [t[0] for t in b.trials]
    assert a.coverage >= 0.9 and len(a.trials) == 100
    assert a.token_ids.numel() == a.k and a.cost_source.startswith("measured")


def test_flops_cost_from_config(zipf):
    from tiny import llama_config

    res = select_vocabulary(zipf, llama_config(vocab_size=V), min_coverage=0.8, n_trials=20, k_range=(50, V))
    assert res.cost_source == "architecture-aware FLOPs" and res.coverage >= 0.8


def test_infeasible_constraint_names_best_reachable(zipf):
    with pytest.raises(ValueError, match=r"best is .* at k=100.*Lower min_coverage"):
        select_vocabulary(zipf, CURVE, min_coverage=0.99, n_trials=5, k_range=(50, 100))


def test_resume_loses_no_trial(tmp_path, zipf):
    journal = tmp_path / "study.log"
    first = select_vocabulary(zipf, CURVE, min_coverage=0.9, n_trials=10, storage=journal, k_range=(50, V))
    second = select_vocabulary(zipf, CURVE, min_coverage=0.9, n_trials=20, storage=journal, k_range=(50, V))
    assert len(first.trials) == 10 and len(second.trials) == 20
    assert second.trials[:10] == first.trials


def test_pareto_is_non_dominated_and_plot(tmp_path, zipf):
    res = select_vocabulary(zipf, CURVE, min_coverage=0.9, n_trials=30, k_range=(50, V))
    front = res.pareto
    for k, c, r in front:
        assert not any(c2 > c and r2 <= r for _, c2, r2 in front)
    res.plot_pareto(tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert res.to_dict()["k"] == res.k
