"""Exact expected acceptance of the ideal trimmed drafter (vanilla vs context tokens), checked by brute force."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, make_pair

from hf_vocabspec.evaluation.acceptance import (
    Conversation,
    format_acceptance,
    ideal_acceptance,
)


def brute_force(target, conv: Conversation, kept: torch.Tensor, temperature: float | None, context: bool) -> float:
    """sum_j min(p_j, q_j) with q = p restricted to the draftable set, position by position."""
    with torch.no_grad():
        logits = target(input_ids=conv.ids[None]).logits[0].float()
    total, n = 0.0, 0
    for t in range(conv.answer_start - 1, conv.ids.numel() - 1):
        allowed = torch.zeros(VOCAB, dtype=torch.bool)
        allowed[kept] = True
        if context:
            allowed[conv.ids[: t + 1]] = True
        if temperature is None:  # greedy: the ideal drafter's argmax is the target's iff it is draftable
            total += float(allowed[logits[t].argmax()])
        else:
            p = (logits[t] / temperature).softmax(-1)
            q = torch.where(allowed, p, 0) / p[allowed].sum()
            total += float(torch.minimum(p, q).sum())
        n += 1
    return total / n


def test_ideal_acceptance_matches_brute_force():
    target, _ = make_pair("gemma3", seed=2, head_scale=6.0)
    g = torch.Generator().manual_seed(0)
    convs = [Conversation(torch.randint(3, VOCAB, (20,), generator=g), 8) for _ in range(3)]
    kept = {"half": torch.arange(0, VOCAB, 2), "quarter": torch.arange(0, VOCAB, 4)}
    res = ideal_acceptance(target, convs, kept, temperatures=(1.0, 0.7))
    for name, ids in kept.items():
        for mode, temp in (("greedy", None), ("t1", 1.0), ("t0.7", 0.7)):
            for ctx in (False, True):
                want = sum(brute_force(target, c, ids, temp, ctx) * (c.ids.numel() - c.answer_start) for c in convs)
                want /= sum(c.ids.numel() - c.answer_start for c in convs)
                got = res[name][mode + ("+context" if ctx else "")]
                assert got == pytest.approx(want, abs=1e-5), (name, mode, ctx)
        assert res[name]["t1+context"] > res[name]["t1"]  # random sequences repeat ids: context helps
    assert res["half"]["t1"] > res["quarter"]["t1"]


def test_acceptance_table():
    report = {"rows": [{"pruned": 0.9, "kept": 100, "greedy": {"acceptance": 0.9, "predicted_tau": 4.7},
                        "greedy+context": {"acceptance": 0.95, "predicted_tau": 5.3}}]}
    assert "| 90% | 100 | 90.0% (tau 4.70) | 95.0% (tau 5.30) |" in format_acceptance(report)
