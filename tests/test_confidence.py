"""The adapted confidence stop (hf_vocabspec.generation.confidence): its round model against a simulation of the
rounds it models (with a power check: the same check fails a model that drops the drafts' chain), the choices it
makes where drafts are always accepted and where unsure drafts are always rejected, and the engine feeding it (greedy
output still target-only's, the threshold moved, and left alone where the switch is off)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

import hf_vocabspec
from hf_vocabspec.generation import confidence, engine
from hf_vocabspec.generation.confidence import BINS, GRID, StopModel, bin_of

MIDS = [(lo + hi) / 2 for lo, hi in zip((0.0, *GRID), (*GRID, 1.0))]  # a confidence inside each bin


def _process(seed: int = 0):
    """A draft process with memory: pi0, a chain that stays in its half (an unsure draft follows an unsure one), and
    an acceptance that rises with the confidence."""
    rng = np.random.default_rng(seed)
    pi0 = rng.dirichlet(np.ones(BINS))
    T_ = rng.dirichlet(np.ones(BINS), size=BINS)
    half = np.arange(BINS) >= BINS // 2
    T_ = T_ * np.where(half[:, None] == half[None, :], 8.0, 1.0)
    T_ /= T_.sum(axis=1, keepdims=True)
    a = np.linspace(0.3, 0.98, BINS)
    return pi0, T_, a


def _simulate(process, threshold: float, cap: int, rounds: int, rng, model: StopModel | None = None):
    """Mean drafts and accepted drafts per round of ``process`` at ``threshold`` over ``rounds`` rounds drawn at
    once (recorded into ``model``: each round's drafts' confidences and accepted count, with made-up seconds)."""
    pi0, T_, a = process
    cum0, cumT = np.cumsum(pi0), np.cumsum(T_, axis=1)
    b = np.minimum((cum0[None, :] < rng.random(rounds)[:, None]).sum(axis=1), BINS - 1)
    drafted = np.zeros((rounds, cap), dtype=int) - 1
    going, ok = np.ones(rounds, dtype=bool), np.ones(rounds, dtype=bool)
    accepted = np.zeros(rounds, dtype=int)
    for k in range(cap):
        drafted[going, k] = b[going]
        ok &= going & (rng.random(rounds) < a[b])
        accepted += ok
        going &= b >= bin_of(threshold)
        b = np.minimum((cumT[b] < rng.random(rounds)[:, None]).sum(axis=1), BINS - 1)
    if model is not None:
        for row, acc in zip(drafted, accepted):
            bins = [x for x in row if x >= 0]
            model.record([MIDS[x] for x in bins], int(acc), len(bins), 0.01 * len(bins), len(bins) + 1, 0.05)
    return (drafted >= 0).sum(axis=1).mean(), accepted.mean()


def _recorded(process, threshold: float, cap: int, rounds: int = 40000) -> StopModel:
    model = StopModel()
    _simulate(process, threshold, cap, rounds, np.random.default_rng(1), model)
    return model


@pytest.mark.parametrize("start", [0.05, 0.3])
def test_round_model_matches_the_rounds_it_models(start, monkeypatch):
    """E[drafts] and E[accepted] of the model fitted on 40,000 rounds at ``start`` (none forgotten) equal a fresh
    simulation's (200,000 rounds) within 3% at every threshold from ``start`` up (below it the chain was never
    seen). Noise: the simulation's means are within ~0.5%, the fitted model's ~1%."""
    monkeypatch.setattr(confidence, "KEEP_DRAFTS", 10**9)
    process, cap = _process(), 8
    model = _recorded(process, start, cap)
    rng = np.random.default_rng(2)
    for t in [g for g in GRID if g >= start]:
        sim = _simulate(process, t, cap, 200000, rng)
        mod = model.expected([t], cap)
        for s, m in zip(sim, mod):
            assert m[0] == pytest.approx(s, rel=0.03), (t, sim, mod)


def test_power_a_model_without_the_chain_fails_the_same_check(monkeypatch):
    """The check above catches a model that takes drafts as independent draws (every chain row the pooled one)."""
    monkeypatch.setattr(confidence, "KEEP_DRAFTS", 10**9)
    process, cap = _process(), 8
    model = _recorded(process, 0.05, cap)
    pooled = model.transitions().mean(axis=0)
    monkeypatch.setattr(StopModel, "transitions", lambda self: np.tile(pooled, (BINS, 1)))
    rng = np.random.default_rng(2)
    worst = 0.0
    for t in [g for g in GRID if g >= 0.05]:
        sim = _simulate(process, t, cap, 200000, rng)
        mod = model.expected([t], cap)
        worst = max(worst, *(abs(m[0] / s - 1) for s, m in zip(sim, mod)))
    assert worst > 0.1, worst


def _choices(accept, threshold: float, draft_s: float, verify_s: tuple[float, float], steps: int = 12) -> list[float]:
    """Thresholds chosen over ``steps`` choices, each after rounds drafted at the one in use (every draft's
    confidence uniform over the bins, accepted with ``accept(c)``)."""
    rng = np.random.default_rng(0)
    model, chosen = StopModel(), [threshold]
    for _ in range(steps):
        for _ in range(64):
            bins = []
            while True:
                bins.append(int(rng.integers(BINS)))
                if bins[-1] < bin_of(threshold) or len(bins) == 12:
                    break
            cs = [MIDS[b] for b in bins]
            acc = next((k for k, c in enumerate(cs) if not accept(c)), len(cs))
            model.record(cs, acc, len(cs), draft_s * len(cs), len(cs) + 1,
                         verify_s[0] + verify_s[1] * (len(cs) + 1))
        threshold = model.choose(threshold, 12)
        chosen.append(threshold)
    return chosen


def test_drafts_always_accepted_lower_the_stop_one_step_at_a_time():
    chosen = _choices(lambda c: True, 0.4, draft_s=0.02, verify_s=(0.07, 0.003))
    assert chosen[-1] <= 0.05, chosen
    for before, after in zip(chosen, chosen[1:]):  # never more than one step of the grid down
        assert after >= GRID[max(0, GRID.index(before) - 1)], chosen


def test_unsure_drafts_rejected_raise_the_stop():
    chosen = _choices(lambda c: c >= 0.5, 0.1, draft_s=0.02, verify_s=(0.07, 0.003))
    assert chosen[-1] >= 0.5, chosen
    kept = _choices(lambda c: c >= 0.5, 0.5, draft_s=0.02, verify_s=(0.07, 0.003))
    assert set(kept) == {0.5}, kept


def test_too_few_records_keep_the_threshold():
    model = StopModel()
    model.record([0.9, 0.1], 2, 2, 0.02, 3, 0.08)
    assert model.choose(0.4, 12) == 0.4 and model.threshold is None  # no choice made yet


def _sure_pair():
    """A tiny llama target whose drafter is its own copy, trimmed to every id, with a sharp head: every draft is
    accepted, most with a confidence above 0.4 and some below."""
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    target = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(6.0)
    target.generation_config.pad_token_id = 0
    base = T.AutoModelForCausalLM.from_config(config).eval()
    base.load_state_dict(target.state_dict())
    drafter = hf_vocabspec.trim_drafter(base, torch.arange(64))
    drafter.generation_config.num_assistant_tokens = 8
    drafter.generation_config.assistant_confidence_threshold = 0.9
    return target, drafter


def test_the_engine_adapts_the_stop_and_output_stays_the_targets(monkeypatch):
    """Greedy calls with a drafter that is the target's copy: the output is target-only's call after call, every
    round but each call's first (which prefills) is timed with its verify positions, the stats name the adapted
    threshold and, every draft accepted, it comes down from 0.9; with ``drafter.adapt_confidence_threshold = False``
    it stays (stats say nothing). The costs the model weighs are fixed (a draft step a tenth of a verify), so the
    choice does not hang on this machine's timings."""
    monkeypatch.setattr(StopModel, "costs", lambda self: (0.001, 0.01, 0.0))
    target, drafter = _sure_pair()
    g = torch.Generator().manual_seed(3)
    calls = [torch.randint(1, 64, (1, 6), generator=g) for _ in range(6)]
    kw = dict(do_sample=False, max_new_tokens=40)
    for ids in calls:
        ref = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, **kw)
        assert torch.equal(out, ref)
    stop = drafter.last_speculation_stats.confidence_stop
    (model,) = engine.stop_models(drafter).values()
    assert len(model.timed) >= confidence.MIN_ROUNDS
    assert all(m == f + 1 and d > 0 and v > 0 for f, d, m, v in model.timed)  # a verify: last token + the drafts
    assert "adapted from 0.9" in stop and float(stop.split()[0]) < 0.9, stop
    drafter.adapt_confidence_threshold = False
    ids = calls[0]
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, **kw)
    assert torch.equal(out, target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw))
    assert drafter.last_speculation_stats.confidence_stop == ""
    assert not confidence.adapts(drafter)


@pytest.mark.parametrize("counter", ["trials_run", "compiled_graphs"])
def test_rounds_that_ran_kernel_trials_or_compiled_are_not_timed(counter, monkeypatch):
    """The stop weighs the steps' own seconds: a round in which a kernel trial ran (its forwards ran the slower
    candidates) or a graph was compiled is recorded for its drafts' confidences and outcomes but not timed. Here
    every round sees the counter move (for graphs, steps that say they run compiled, as compiled steps' rounds are
    the ones that read it): no round is timed, the drafts are still judged and the output is target-only's; the
    power check is the test above (the counters still: rounds are timed)."""
    count = iter(range(10**6))
    monkeypatch.setattr(engine, counter, lambda: next(count))
    if counter == "compiled_graphs":
        monkeypatch.setattr(engine.DraftStep, "compiled", property(lambda self: True))
    target, drafter = _sure_pair()
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(4))
    kw = dict(do_sample=False, max_new_tokens=40)
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, **kw)
    assert torch.equal(out, target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw))
    (model,) = engine.stop_models(drafter).values()
    assert model.judged_drafts > 0 and len(model.timed) == 0
