"""Choosing the kept vocabulary size k: Optuna TPE under a minimum-coverage constraint.

Two objectives over k (the top-k tokens by assistant-token count are kept):
- ``"throughput"`` (default): predicted speedup of speculative decoding, from the walltime formula
  (1 - a^(L+1)) / ((1 - a)(L c + 1)) with per-token acceptance a(k) = acceptance_at_full * C(k)
  (a target token outside the kept set can never be drafted) and draft/target cost ratio
  c(k) = draft_to_target_cost * cost(k)/cost(V). It optimises what users want, with no hand-set weight.
- ``"utility"``: seed 000's U(k) = alpha * C(k) + (1 - alpha) * R(k), R(k) = 1 - cost(k)/cost(V), kept
  to reproduce the paper; alpha has no principled value.
``cost`` is a measured :class:`~hf_vocabspec.cost.LatencyCurve` (preferred: the head is memory-bound, not
linear in k) or a model config (architecture-aware FLOPs); the result records which was used.
Trials only read the cached coverage curve, so 100 trials take seconds; a JournalStorage file makes
a long or distributed study resumable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .coverage import TokenCounts
from .cost import LatencyCurve, draft_flops


def relative_cost_fn(cost, vocab_size: int) -> tuple[Callable[[int], float], str]:
    """k -> draft-step cost relative to the full head, and a label saying where it comes from."""
    if isinstance(cost, LatencyCurve):
        full = cost.predict(vocab_size)
        return (lambda k: cost.predict(k) / full), f"measured latency ({cost.device}, {cost.dtype})"
    if callable(cost):
        return cost, "user-supplied cost function"
    if hasattr(cost, "get_text_config") or hasattr(cost, "hidden_size"):
        full = draft_flops(cost, vocab_size)["total"]
        return (lambda k: draft_flops(cost, k)["total"] / full), "architecture-aware FLOPs"
    raise ValueError("cost must be a LatencyCurve (hf_vocabspec.cost.measure_draft_latency), a model config, "
                     "or a callable k -> relative draft cost.")


def predicted_speedup(acceptance: float, num_draft: int, cost_ratio: float) -> float:
    """Expected walltime gain of speculative decoding (Leviathan et al.)."""
    a = min(max(acceptance, 0.0), 1 - 1e-9)
    return (1 - a ** (num_draft + 1)) / ((1 - a) * (num_draft * cost_ratio + 1))


@dataclass
class SelectionResult:
    k: int
    coverage: float
    objective: str
    value: float
    relative_draft_cost: float
    cost_source: str
    min_coverage: float
    token_ids: torch.Tensor = field(repr=False)
    trials: list[tuple[int, float, float, float]] = field(default_factory=list, repr=False)  # k, C, cost, value
    sweep: list[tuple[int, float, float]] = field(default_factory=list, repr=False)  # k, C, cost

    @property
    def predicted_draft_speedup(self) -> float:
        """Draft-step speedup at k over the full head, by the cost model used."""
        return 1.0 / self.relative_draft_cost

    @property
    def pareto(self) -> list[tuple[int, float, float]]:
        """Non-dominated (k, coverage, cost) points: no other point has more coverage at no more cost."""
        pts = sorted({(k, c, r) for k, c, r, _ in self.trials} | set(self.sweep), key=lambda p: (p[2], -p[1]))
        front, best = [], -1.0
        for p in pts:
            if p[1] > best:
                front.append(p)
                best = p[1]
        return front

    def to_dict(self) -> dict:
        return {"k": self.k, "coverage": self.coverage, "objective": self.objective, "value": self.value,
                "relative_draft_cost": self.relative_draft_cost, "cost_source": self.cost_source,
                "predicted_draft_speedup": self.predicted_draft_speedup, "min_coverage": self.min_coverage,
                "pareto": self.pareto, "trials": self.trials}

    def plot_pareto(self, path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        sw = sorted(self.sweep)  # by k: coverage and cost both grow with k
        ax.plot([p[2] for p in sw], [p[1] for p in sw], "-", color="gray", lw=1, label="top-k sweep")
        ax.scatter([t[2] for t in self.trials], [t[1] for t in self.trials], s=12, alpha=0.6, label="TPE trials")
        front = self.pareto
        ax.plot([p[2] for p in front], [p[1] for p in front], "-", color="C2", lw=1.5, label="Pareto frontier")
        ax.axhspan(0, self.min_coverage, color="red", alpha=0.07, label=f"infeasible (coverage < {self.min_coverage})")
        ax.scatter([self.relative_draft_cost], [self.coverage], marker="*", s=180, color="C3", zorder=5,
                   label=f"chosen k={self.k:,}")
        lo = min([p[1] for p in sw] + [self.min_coverage]) - 0.02
        ax.set_ylim(max(lo, 0), 1.0)
        ax.set_xlabel(f"relative draft-step cost ({self.cost_source})")
        ax.set_ylabel("coverage of assistant tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def select_vocabulary(
    counts: TokenCounts,
    cost,
    *,
    min_coverage: float = 0.95,
    objective: str = "throughput",
    alpha: float = 0.5,
    n_trials: int = 100,
    seed: int = 42,
    k_range: tuple[int, int] = (50, 50000),
    storage: str | Path | None = None,
    study_name: str = "hf_vocabspec-vocabulary",
    acceptance_at_full: float = 0.98,
    num_draft: int = 5,
    draft_to_target_cost: float = 0.5,
) -> SelectionResult:
    """Search k with TPE (seeded, reproducible) subject to coverage(k) >= min_coverage."""
    import optuna

    if objective not in ("throughput", "utility"):
        raise ValueError(f"objective must be 'throughput' or 'utility'; got {objective!r}.")
    lo, hi = max(1, k_range[0]), min(k_range[1], counts.vocab_size)
    if lo > hi:
        raise ValueError(f"Empty k_range {k_range} for a vocabulary of {counts.vocab_size}.")
    best_cov = counts.coverage(hi)
    if best_cov < min_coverage:
        raise ValueError(
            f"No k in [{lo}, {hi}] reaches coverage {min_coverage:.2%}: the best is {best_cov:.2%} at k={hi}. "
            f"Lower min_coverage (to at most {math.floor(best_cov * 1000) / 1000}) or widen k_range."
        )
    rel_cost, source = relative_cost_fn(cost, counts.vocab_size)

    def value_of(k: int) -> tuple[float, float, float]:
        c, r = counts.coverage(k), rel_cost(k)
        if objective == "utility":
            v = alpha * c + (1 - alpha) * (1 - r)
        else:
            v = predicted_speedup(acceptance_at_full * c, num_draft, draft_to_target_cost * r)
        return c, r, v

    def objective_fn(trial: optuna.Trial) -> float:
        k = trial.suggest_int("k", lo, hi, log=True)
        c, r, v = value_of(k)
        trial.set_constraint("coverage", min_coverage - c)
        trial.set_user_attr("coverage", c)
        trial.set_user_attr("relative_cost", r)
        return v

    if storage is not None and not str(storage).startswith(("sqlite:", "postgresql:", "mysql:")):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(storage)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize", study_name=study_name, storage=storage, load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, n_trials)),
    )
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < n_trials:
        study.optimize(objective_fn, n_trials=n_trials - len(done))
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in trials if all(v <= 0 for v in t.constraints.values())]
    if not feasible:  # TPE never sampled a feasible k: fall back to the smallest feasible k
        k = max(lo, counts.smallest_k_for_coverage(min_coverage))
    else:
        k = max(feasible, key=lambda t: (t.value, -t.params["k"])).params["k"]
    c, r, v = value_of(k)
    sweep_ks = sorted({int(round(x)) for x in torch.logspace(math.log10(lo), math.log10(hi), 60).tolist()})
    sweep = [(kk, counts.coverage(kk), rel_cost(kk)) for kk in sweep_ks]
    return SelectionResult(
        k=k, coverage=c, objective=objective, value=v, relative_draft_cost=r, cost_source=source,
        min_coverage=min_coverage, token_ids=counts.top_k(k),
        trials=[(t.params["k"], t.user_attrs["coverage"], t.user_attrs["relative_cost"], t.value) for t in trials],
        sweep=sweep,
    )
