"""The confidence stop, adapted: the threshold under which a round's modelled tokens per second are highest.

A round drafts until the drafter gives a draft less than the threshold (transformers' ``assistant_confidence_threshold``,
proposing that draft), or L drafts. Which threshold pays depends on the pair and the machine: a drafter that is the
target's own body with a trimmed head (pair G) has its drafts accepted even where it is unsure, so a stop at 0.4 ends
rounds that would have gone on (machine F, 2026-12-07, greedy, L = 12: 1.75x at 0.4, 1.89x at 0.1); a smaller drafter
(pair Q) is right to stop there (1.27x at 0.4, 0.79x at 0.1). transformers' own loop adapts its threshold too
(``AssistedCandidateGenerator.update_candidate_strategy``: an ROC cost, false positives plus three times false
negatives); this one weighs what a threshold buys against what it costs on this machine:

- what the drafts showed, in confidence bins whose edges are the thresholds of ``GRID``: the first draft's bin, the
  next draft's bin after each (a Markov chain: an unsure draft tends to follow an unsure one; a row whose drafts were
  never seen to go on, below the threshold in use, is the pooled next-draft distribution) and each judged draft's
  outcome (the accepted ones and the first rejected; later drafts are never judged), each bin's acceptance a(bin)
  shrunk towards the overall rate by ``PRIOR_DRAFTS``;
- what the rounds cost: a draft step t_d (drafting seconds over drafter forwards) and a verify forward of m positions
  v0 + v1 m (least squares over the timed rounds; a call's first round, which also prefills, is left out).

A round at threshold t with at most L drafts then has E[drafts] = sum_k sum_j d_k[j] and E[accepted] = sum_k sum_j
e_k[j], where d_1 = pi0, e_1 = pi0 a, d_{k+1} = (d_k 1{j >= t}) T and e_{k+1} = ((e_k 1{j >= t}) T) a, and its tokens
per second are (1 + E[accepted]) / (t_d E[drafts] + v0 + v1 (1 + E[drafts])). :meth:`StopModel.choose` takes the best
threshold of ``GRID`` (and the one in use) if it models ``MIN_GAIN`` more, going down at most one seen bin at a time
(the chain below the threshold in use was never seen: a step down shows it before the next).

Exactness: the threshold decides how many drafts a round proposes, never what is output (verification judges every
draft). Scope: rounds of one row whose confidences the loop reads on the host anyway (a CPU, no draft constraint:
``SpeculativeEngine._draft``), so it adds no device read; elsewhere the configured threshold holds. What a drafter's
calls showed is kept per (drafter, target, setting) for its later calls. ``drafter.adapt_confidence_threshold = False``
keeps the configured threshold.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GRID", "MIN_GAIN", "MIN_OUTCOMES", "MIN_ROUNDS", "StopModel", "adapts", "bin_of", "recorded", "stop_model"]

# Thresholds the choice ranges over (never 0: a stop that is off would read no more confidences to learn from); the
# confidence bins' edges.
GRID = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
EDGES = np.array(GRID)
BINS = len(GRID) + 1
PRIOR_DRAFTS = 2.0  # each bin's (and each chain row's) prior: this many drafts at the pooled rate / distribution
MIN_OUTCOMES = 32  # judged drafts before the first choice
MIN_ROUNDS = 8  # timed rounds before the first choice
MIN_GAIN = 1.02  # a threshold replaces the one in use only for this much more modelled tokens per second
EVERY = 8  # rounds between choices (a choice is ~0.1 ms: amortised over near-free rounds too)
KEEP_DRAFTS, KEEP_ROUNDS = 4096, 256  # counts are halved past this many drafts; timed rounds kept


def bin_of(c: float) -> int:
    """The confidence bin of ``c``: how many of ``GRID``'s thresholds it reaches (a stop at GRID[i] ends the round
    after a draft of bin <= i)."""
    return int(np.searchsorted(EDGES, c, side="right"))


@dataclass
class StopModel:
    """What one (drafter, target, setting)'s rounds showed, and the threshold they chose."""

    threshold: float | None = None  # the latest choice (None: none made yet)
    first: np.ndarray = field(default_factory=lambda: np.zeros(BINS))  # first drafts' bins
    chain: np.ndarray = field(default_factory=lambda: np.zeros((BINS, BINS)))  # draft bin -> next draft's bin
    judged: np.ndarray = field(default_factory=lambda: np.zeros(BINS))  # judged drafts per bin
    hits: np.ndarray = field(default_factory=lambda: np.zeros(BINS))  # accepted drafts per bin
    drafting: deque = field(default_factory=lambda: deque(maxlen=KEEP_ROUNDS))  # (forwards, seconds)
    verifying: deque = field(default_factory=lambda: deque(maxlen=KEEP_ROUNDS))  # (positions, seconds)
    rounds_since: int = 0

    def record(self, confidences: list[float], accepted: int, forwards: int, draft_seconds: float,
               positions: int, verify_seconds: float, timed: bool = True) -> None:
        """One row's round: the confidences of its proposed drafts in order, how many were accepted, and (``timed``)
        its drafter forwards and verify positions with their seconds."""
        bins = [bin_of(c) for c in confidences]
        if bins:
            self.first[bins[0]] += 1
        for i, j in zip(bins, bins[1:]):
            self.chain[i, j] += 1
        for k, b in enumerate(bins[: accepted + 1]):  # the accepted ones and the first rejected (if any)
            self.judged[b] += 1
            self.hits[b] += k < accepted
        if self.judged.sum() > KEEP_DRAFTS:  # older rounds count half: the record follows the text
            for a in (self.first, self.chain, self.judged, self.hits):
                a *= 0.5
        if timed and forwards:
            self.drafting.append((forwards, draft_seconds))
            self.verifying.append((positions, verify_seconds))
        self.rounds_since += 1

    def acceptance(self) -> np.ndarray:
        """a(bin): each bin's accepted share of its judged drafts, shrunk towards the overall rate."""
        overall = (self.hits.sum() + 1) / (self.judged.sum() + 2)
        return (self.hits + PRIOR_DRAFTS * overall) / (self.judged + PRIOR_DRAFTS)

    def transitions(self) -> np.ndarray:
        """T[i, j]: the next draft's bin after a draft of bin i, each row shrunk towards the pooled distribution."""
        pooled = (self.chain.sum(axis=0) + self.first + 1) / (self.chain.sum() + self.first.sum() + BINS)
        return (self.chain + PRIOR_DRAFTS * pooled) / (self.chain.sum(axis=1, keepdims=True) + PRIOR_DRAFTS)

    def costs(self) -> tuple[float, float, float]:
        """(t_d, v0, v1): a draft step's seconds and a verify of m positions' v0 + v1 m (v0, v1 >= 0)."""
        f = np.array(self.drafting)
        t_d = f[:, 1].sum() / f[:, 0].sum()
        ms, ss = np.array(self.verifying).T
        var = ((ms - ms.mean()) ** 2).sum()
        v1 = max(0.0, float(((ms - ms.mean()) * (ss - ss.mean())).sum() / var)) if var > 0 else 0.0
        return float(t_d), max(0.0, float(ss.mean() - v1 * ms.mean())), v1

    def expected(self, thresholds, cap: int) -> tuple[np.ndarray, np.ndarray]:
        """(E[drafts], E[accepted]) of a round at each of ``thresholds`` with at most ``cap`` drafts."""
        go = np.array([[b >= bin_of(t) for b in range(BINS)] for t in thresholds], dtype=float)  # drafting goes on
        pi0 = (self.first + 1) / (self.first.sum() + BINS)
        a, T = self.acceptance(), self.transitions()
        d = np.tile(pi0, (len(thresholds), 1))
        e = d * a
        drafts, accepted = d.sum(axis=1), e.sum(axis=1)
        for _ in range(cap - 1):
            d = (d * go) @ T
            e = ((e * go) @ T) * a
            drafts += d.sum(axis=1)
            accepted += e.sum(axis=1)
        return drafts, accepted

    def rates(self, thresholds, cap: int) -> np.ndarray:
        """Modelled tokens per second of rounds at each of ``thresholds`` (see the module docstring)."""
        t_d, v0, v1 = self.costs()
        drafts, accepted = self.expected(thresholds, cap)
        return (1.0 + accepted) / (t_d * drafts + v0 + v1 * (1.0 + drafts))

    def ready(self) -> bool:
        return self.judged.sum() >= MIN_OUTCOMES and len(self.verifying) >= MIN_ROUNDS

    def choose(self, current: float, cap: int) -> float:
        """The threshold to draft with next: the best of ``GRID`` by modelled rate if it beats ``current``'s by
        ``MIN_GAIN``, else ``current`` (also while the records are too few); down at most to where drafts of one
        more bin that drafts were seen in go on (their chain row is the prior until then)."""
        self.rounds_since = 0
        if not self.ready():
            return current
        # down to the first threshold that lets drafts of one more seen bin go on (empty bins skipped)
        seen = self.first + self.chain.sum(axis=0)
        b = bin_of(current) - 1
        while b > 0 and not seen[b]:
            b -= 1
        options = [t for t in GRID if t >= GRID[max(b - 1, 0)]]
        rates = self.rates([current, *options], cap)
        best = int(np.argmax(rates[1:]))
        chosen = options[best] if rates[1 + best] > MIN_GAIN * rates[0] else current
        self.threshold = chosen
        return chosen


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> {setting: StopModel}


def stop_model(assistant, setting: tuple) -> StopModel:
    """The drafter's record for ``setting`` (kept across its calls; a fresh one where the drafter cannot be weakly
    referenced)."""
    try:
        models = _MODELS.setdefault(assistant, {})
    except TypeError:
        return StopModel()
    return models.setdefault(setting, StopModel())


def recorded(assistant) -> dict[tuple, StopModel]:
    """The drafter's records so far, per (target id, sampling, L, schedule, processors, configured threshold)."""
    try:
        return dict(_MODELS.get(assistant, {}))
    except TypeError:
        return {}


def adapts(assistant) -> bool:
    """Whether a call with this drafter adapts its confidence threshold (``drafter.adapt_confidence_threshold``,
    on unless set False)."""
    return bool(getattr(assistant, "adapt_confidence_threshold", True))
