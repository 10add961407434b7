"""Exact-marginal lossless checks shared by every generation mode's tests (plain, context tokens, RDK, SSD,
verify head): thousands of short generations through ``target.generate(assistant_model=...)``, first two
generated tokens compared with the EXACT target marginals (enumerated tiny vocabulary) by chi-square;
p-value >= PVALUE_THRESHOLD passes (fixed seeds: deterministic). Each mode's test file also runs the check
with a deliberately wrong q, which must FAIL (power)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from tiny import EOS, VOCAB, make_pair
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import hf_vocabspec

PVALUE_THRESHOLD = 1e-3
N_DRAWS = 2000
# A power check draws a quarter as many: a wrong law must fail already on the first POWER_DRAWS of the same seeded
# stream (the full check's N_DRAWS include them; its statistic only grows with more draws under a wrong law).
POWER_DRAWS = N_DRAWS // 4
PROMPT = torch.tensor([[1, 5, 7, 12, 9]])


def reference_processors(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0) -> LogitsProcessorList:
    """The processors HF builds for these knobs, in HF's order (min length, penalties, then warpers).

    The draws use min_new_tokens=3, so EOS is impossible at the two positions tested.
    """
    procs = LogitsProcessorList([SuppressTokensLogitsProcessor([EOS])])
    if repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


@torch.no_grad()
def exact_marginals(target, prompt, knobs) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distributions of generated tokens 1 and 2 under target-only sampling."""
    procs = reference_processors(**knobs)
    logits1 = target(prompt).logits[:, -1].float()
    p1 = procs(prompt, logits1).softmax(-1)[0].double()
    ctx = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
    logits2 = target(ctx).logits[:, -1].float()
    p2_given = torch.stack([procs(ctx[i : i + 1], logits2[i : i + 1])[0] for i in range(VOCAB)]).softmax(-1).double()
    return p1, p1 @ p2_given


def draw(target, drafter, knobs, n=N_DRAWS, seed=1234, prompt=PROMPT, batch: int = 1,
         num_assistant_tokens: int = 2, max_new_tokens: int = 3) -> torch.Tensor:
    """n samples of generated tokens 1-2; ``batch`` > 1 draws them as num_return_sequences rows of one call (the
    engine's batched path), n // batch calls. (A round drafts at most ``max_new_tokens`` - 1.)"""
    torch.manual_seed(seed)
    L = prompt.shape[1]
    out = []
    for _ in range(n // batch):
        seq = target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=True,
            max_new_tokens=max_new_tokens,
            min_new_tokens=3,
            num_assistant_tokens=num_assistant_tokens,
            assistant_model=drafter,
            **({"num_return_sequences": batch} if batch > 1 else {}),
            **({"top_k": 0} | knobs),
        )
        out.append(seq[:, L : L + 2])
    return torch.cat(out)


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit; cells with expected count < 5 are pooled into one cell."""
    samples, probs = samples.cpu(), probs.cpu()
    n = samples.numel()
    observed = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def check_lossless(target, drafter, knobs, pruned_probe: int | None = None, prompt=PROMPT, batch: int = 1,
                   num_assistant_tokens: int = 2, max_new_tokens: int = 3, n: int = N_DRAWS) -> dict:
    p1, p2 = exact_marginals(target, prompt, knobs)
    samples = draw(target, drafter, knobs, n=n, prompt=prompt, batch=batch, num_assistant_tokens=num_assistant_tokens,
                   max_new_tokens=max_new_tokens)
    result = {"p_first": chi2_pvalue(samples[:, 0], p1), "p_second": chi2_pvalue(samples[:, 1], p2)}
    assert result["p_first"] >= PVALUE_THRESHOLD, result
    assert result["p_second"] >= PVALUE_THRESHOLD, result
    if pruned_probe is not None:
        # A token the drafter cannot propose still appears at the target's rate (it comes from the residual).
        n = samples.shape[0]
        rate, expect = float((samples[:, 0] == pruned_probe).double().mean()), float(p1[pruned_probe])
        z = abs(rate - expect) / max((expect * (1 - expect) / n) ** 0.5, 1e-12)
        result["pruned_rate"], result["pruned_expected"], result["z"] = rate, expect, z
        assert expect > 0.02, "test setup: the probe token should carry real target mass"
        assert z < 4.0, result
    return result


def permuted_scatter(vocab_size: int):
    """A ``DraftVocabulary.scatter`` that places q's values through a permuted map (the kept ids rolled by one): q
    is then not the law the drafts came from. For power checks (monkeypatch it onto ``DraftVocabulary``)."""
    def wrong_scatter(self, values, fill=float("-inf"), size=None):
        out = values.new_full((*values.shape[:-1], size or vocab_size), fill)
        out[..., self.ids.roll(1)] = values
        return out

    return wrong_scatter


def check_detected(target, drafter, knobs, n: int = POWER_DRAWS, **kwargs) -> str:
    """Power: :func:`check_lossless` on a deliberately wrong law, row or protocol must FAIL, already with ``n``
    draws (``POWER_DRAWS``; ``n=N_DRAWS`` for a wrong law that moves little mass). Returns the failing assertion's
    text (the p-values, or the probe's z).

    Measured (machine B, 2026-12-01): at POWER_DRAWS every power check's smallest p-value was below 1e-25, except
    the untied context tokens' wrong q, which passed there and keeps N_DRAWS (p 0.96 / 1.3e-6 at 2000)."""
    with pytest.raises(AssertionError) as failed:
        check_lossless(target, drafter, knobs, n=n, **kwargs)
    return str(failed.value)


def pruned_drafter(kind="llama", n_pruned=24, seed=0):
    """Trim so that the target's 2nd most likely first token is pruned (exercises the residual)."""
    target, base = make_pair(kind, seed=seed, head_scale=12.0)
    with torch.no_grad():
        p1 = target(PROMPT).logits[0, -1].softmax(-1)
    order = p1.argsort(descending=True).tolist()
    probe = order[1]
    rest = [t for t in order[3:] if t != 2]
    pruned = {probe, *rest[:n_pruned - 1]}
    keep = [t for t in range(VOCAB) if t not in pruned]
    drafter = hf_vocabspec.trim_drafter(base, keep)
    assert probe not in drafter.d2t.tolist()
    return target, drafter, probe


# --- SSD: three sampled tokens against the exact target marginals (tests/test_ssd.py, test_ssd_worker.py) ----------
SSD_DRAWS = 600  # SSD draws cost more (a tree per round); the power check fails at p ~ 1e-36 with 600
SSD_PROMPT = torch.tensor([[1, 5, 7, 12, 9]])


@torch.no_grad()
def exact_marginals3(target, prompt, knobs) -> list[torch.Tensor]:
    """Exact distributions of generated tokens 1, 2, 3 under target-only sampling (vocabulary enumerated)."""
    procs = reference_processors(**knobs)

    def cond(ctx):  # (N, n) contexts -> (N, V) next-token distributions
        return procs(ctx, target(ctx).logits[:, -1].float()).softmax(-1).double()

    p1 = cond(prompt)[0]
    ctx1 = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
    p2_given = cond(ctx1)  # (V, V)
    joint12 = p1[:, None] * p2_given
    ctx2 = torch.cat([ctx1.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(VOCAB)[:, None]], dim=1)
    p3 = joint12.reshape(-1) @ cond(ctx2)
    return [p1, joint12.sum(0), p3]


def check_ssd_lossless(target, session, knobs, n=SSD_DRAWS, seed=1234, prompt=SSD_PROMPT, min_hits=SSD_DRAWS // 10) -> dict:
    exact = exact_marginals3(target, prompt, knobs)
    torch.manual_seed(seed)
    L = prompt.shape[1]
    samples = torch.empty(n, 3, dtype=torch.long)
    hits = lookups = context = pruned = 0
    for i in range(n):
        seq = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=4,
                              min_new_tokens=4, num_assistant_tokens=2, assistant_model=session,
                              **({"top_k": 0} | knobs))
        samples[i] = seq[0, L : L + 3]
        hits += session.last_stats.hits
        lookups += session.last_stats.lookups
        context += session.last_stats.context_proposed
        pruned += session.last_stats.pruned_proposed
    result = {f"p{k + 1}": chi2_pvalue(samples[:, k], exact[k]) for k in range(3)}
    result["hit_rate"], result["context_proposed"], result["pruned_proposed"] = hits / max(lookups, 1), context, pruned
    assert hits > min_hits, result  # the later tokens really came from cached branches
    for k in range(3):
        assert result[f"p{k + 1}"] >= PVALUE_THRESHOLD, result
    return result
