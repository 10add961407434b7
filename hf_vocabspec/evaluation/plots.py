"""Figures of the core's results: a measured draft-step latency curve, a vocabulary selection's Pareto front,
a tune's predicted tokens/s heat map. Tooling: the core (cost, selection) returns numbers only and never
imports matplotlib (tests/test_layout.py checks it); these write PNGs with a bare ``Figure`` (no pyplot, so the
user's backend is left alone)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..cost import LatencyCurve
    from ..selection import SelectionResult, ThroughputModel, TuneResult

__all__ = ["plot_latency_curve", "plot_pareto", "plot_tune_heatmap"]


def _figure(**kwargs):
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def plot_latency_curve(curve: LatencyCurve, path) -> None:
    """PNG: measured step latency vs k (log x), the interpolation, and the body-only floor."""
    fig = _figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(curve.ks, [s * 1e3 for s in curve.seconds], "o", label="measured: body + k-row head (median)")
    lo, hi = max(1.0, min(curve.ks) / 2), max(curve.ks)
    grid = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(float(hi))), 200).tolist()
    ax.plot(grid, [curve.predict(x) * 1e3 for x in grid], "-", lw=1, color="C0", alpha=0.6,
            label="predict(k): piecewise-linear")
    ax.axhline(curve.floor_seconds * 1e3, ls="--", color="gray", label="body-only floor (k=0)")
    ax.set_xscale("log")
    ax.set_xlabel("kept vocabulary size k (LM-head rows)")
    ax.set_ylabel("ms per draft step")
    ax.set_title(f"draft-step latency ({curve.device}, {curve.dtype}, context {curve.context_length})", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_pareto(result: SelectionResult, path) -> None:
    """PNG: coverage vs relative draft cost; sweep, trials, Pareto front, chosen k, infeasible band shaded."""
    fig = _figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    sw = sorted(result.sweep)
    ax.plot([p[2] for p in sw], [p[1] for p in sw], "-", color="gray", lw=1, label="top-k sweep")
    ax.scatter([t.relative_cost for t in result.trials], [t.coverage for t in result.trials], s=12, alpha=0.6,
               label="TPE trials")
    front = result.pareto
    ax.plot([p[2] for p in front], [p[1] for p in front], "-", color="C2", lw=1.5, label="Pareto frontier")
    lo = max(min([p[1] for p in sw] + [result.min_coverage]) - 0.02, 0.0)
    ax.axhspan(lo, result.min_coverage, color="red", alpha=0.08,
               label=f"infeasible (coverage < {result.min_coverage:g})")
    ax.scatter([result.relative_draft_cost], [result.coverage], marker="*", s=180, color="C3", zorder=5,
               label=f"chosen k={result.k:,} (C={result.coverage:.2%})")
    ax.set_ylim(lo, 1.0 + 0.005)
    ax.set_xlabel(f"draft-step cost relative to the full head ({result.cost_source})", fontsize=8)
    ax.set_ylabel("coverage of assistant tokens")
    ax.set_title(f"objective={result.objective}: {result.value:.3f}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_tune_heatmap(result: TuneResult, path, model: ThroughputModel | None = None) -> None:
    """PNG: predicted tokens/s over (k, L), one panel per context-token setting, the choice starred.

    With ``model`` the full grid is drawn; without, only the trials (unvisited cells blank).
    """
    trials = result.trials
    ks = sorted({t.k for t in trials} | (set(model.acceptance.ks) if model else set()))
    ls = sorted({t.num_draft_tokens for t in trials} | (set(model.draft_lengths) if model else set()))
    ctxs = sorted({t.context_tokens for t in trials} | (set(model.context_options) if model else set()))
    cells = [tuple(t) for t in trials]
    if model is not None:
        cells += [(*cell, model.tokens_per_second(*cell)) for cell in model.grid()]
    values: dict = {}
    for k, n, c, _t, v in cells:  # the best confidence threshold of each cell
        values[(k, n, c)] = max(v, values.get((k, n, c), v))
    vmax = max(values.values())
    vmin = min(values.values())
    fig = _figure(figsize=(4.8 * len(ctxs), 4.2), layout="constrained")
    axes = fig.subplots(1, len(ctxs), squeeze=False)[0]
    for ax, c in zip(axes, ctxs):
        grid = torch.full((len(ls), len(ks)), float("nan"))
        for (k, n, cc), v in values.items():
            if cc == c:
                grid[ls.index(n), ks.index(k)] = v
        im = ax.imshow(grid.numpy(), origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap="viridis")
        for i in range(len(ls)):
            for j in range(len(ks)):
                if not math.isnan(float(grid[i, j])):
                    ax.text(j, i, f"{float(grid[i, j]):.3g}", ha="center", va="center", fontsize=6, color="w")
        if c == result.context_tokens:
            ax.scatter([ks.index(result.k)], [ls.index(result.num_draft_tokens)], marker="*", s=220,
                       color="red", label=f"chosen k={result.k:,}, L={result.num_draft_tokens}"
                       + (f", stop below {result.confidence_threshold:g}" if result.confidence_threshold else ""))
            ax.legend(fontsize=7, loc="upper right")
        ax.set_xticks(range(len(ks)), [f"{k:,}" for k in ks], rotation=45, fontsize=7)
        ax.set_yticks(range(len(ls)), [str(n) for n in ls], fontsize=7)
        ax.set_xlabel("kept vocabulary size k")
        ax.set_ylabel("draft length L")
        ax.set_title(f"predicted tokens/s (best threshold), context tokens {'on' if c else 'off'}", fontsize=9)
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.savefig(path, dpi=120)
