"""Side-by-side measurement of generation methods: tokens/s, acceptance, mean accepted length.

Methods are interleaved prompt by prompt and repeated, so slow drifts of a noisy machine hit all methods
alike; only ratios measured in the same run are reported as speedups.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from .drafter import TrimmedDrafter


@dataclass
class Method:
    """One way to generate: target only (assistant None), HF assisted, or a TrimmedDrafter."""

    name: str
    assistant: torch.nn.Module | None = None


@dataclass
class MethodResult:
    name: str
    new_tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens_per_s_runs: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.rounds if self.rounds else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("outputs")
        d.update(tokens_per_s=self.tokens_per_s, acceptance_rate=self.acceptance_rate,
                 mean_accepted_length=self.mean_accepted_length)
        if len(self.tokens_per_s_runs) > 1:
            d["tokens_per_s_median"] = statistics.median(self.tokens_per_s_runs)
            d["tokens_per_s_spread"] = max(self.tokens_per_s_runs) - min(self.tokens_per_s_runs)
        return d


@contextlib.contextmanager
def count_hf_acceptance() -> Iterator[dict]:
    """Count rounds/proposed/accepted of HF's own AssistedCandidateGenerator (the peer baseline)."""
    counters = {"rounds": 0, "proposed": 0, "accepted": 0}
    original = AssistedCandidateGenerator.update_candidate_strategy

    def counting(self, input_ids, scores, num_matches):
        if type(self) is AssistedCandidateGenerator:
            counters["rounds"] += 1
            counters["proposed"] += scores.shape[1] - 1
            counters["accepted"] += int(num_matches)
        return original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = counting
    try:
        yield counters
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original


def compare_methods(
    target,
    methods: Sequence[Method],
    prompts: Sequence[torch.LongTensor],
    *,
    max_new_tokens: int = 64,
    repeats: int = 1,
    generate_kwargs: dict | None = None,
    progress: Callable | None = None,
    seed: int = 0,
) -> dict[str, MethodResult]:
    """Generate every prompt with every method (interleaved), ``repeats`` times; return per-method totals."""
    generate_kwargs = dict(generate_kwargs or {})
    results = {m.name: MethodResult(m.name) for m in methods}
    steps = [(r, i, m) for r in range(repeats) for i in range(len(prompts)) for m in methods]
    per_run = {(m.name, r): [0, 0.0] for m in methods for r in range(repeats)}
    iterator = progress(steps) if progress else steps
    # warm-up: first calls pay one-off allocation costs
    for m in methods:
        target.generate(prompts[0], max_new_tokens=4, assistant_model=m.assistant, **generate_kwargs)
    for r, i, m in iterator:
        ids = prompts[i]
        torch.manual_seed(seed + i)
        with count_hf_acceptance() as hf_counts:
            t0 = time.perf_counter()
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                assistant_model=m.assistant, **generate_kwargs,
            )
            dt = time.perf_counter() - t0
        res = results[m.name]
        n_new = out.shape[1] - ids.shape[1]
        res.new_tokens += n_new
        res.seconds += dt
        per_run[(m.name, r)][0] += n_new
        per_run[(m.name, r)][1] += dt
        if r == 0:
            res.outputs.append(out[0, ids.shape[1]:].tolist())
        if isinstance(m.assistant, TrimmedDrafter):
            stats = m.assistant.last_speculation_stats
            res.rounds += stats.rounds
            res.proposed += stats.proposed
            res.accepted += stats.accepted
        elif m.assistant is not None:
            res.rounds += hf_counts["rounds"]
            res.proposed += hf_counts["proposed"]
            res.accepted += hf_counts["accepted"]
    for (name, _r), (n, dt) in per_run.items():
        results[name].tokens_per_s_runs.append(n / dt if dt else 0.0)
    return results


def format_table(results: dict[str, MethodResult], baseline: str | None = None) -> str:
    """Markdown table; speedups are relative to ``baseline`` (same run)."""
    base = results[baseline].tokens_per_s if baseline else None
    lines = [
        "| method | tokens/s | speedup | acceptance | mean accepted length (tau) |",
        "|---|---|---|---|---|",
    ]
    for r in results.values():
        acc = f"{r.acceptance_rate:.1%}" if r.acceptance_rate is not None else "-"
        tau = f"{r.mean_accepted_length:.2f}" if r.mean_accepted_length is not None else "-"
        speed = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"| {r.name} | {r.tokens_per_s:.1f} | {speed} | {acc} | {tau} |")
    return "\n".join(lines)
