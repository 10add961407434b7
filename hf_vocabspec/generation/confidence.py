"""The confidence stop, adapted: the threshold under which a round's modelled tokens per second are highest.

A round drafts until the drafter gives a draft less than the threshold (transformers'
``assistant_confidence_threshold``, proposing that draft), or L drafts. Which threshold pays depends on the pair and
the machine: a drafter that is the target's own body with a trimmed head (pair G) has its drafts accepted even where
it is unsure, so a stop at 0.4 ends rounds that would have gone on (machine F, 2026-12-07, greedy, L = 12, a probe
sweeping fixed thresholds: 1.75x at 0.4, 1.89x at 0.1); a smaller drafter (pair Q) is right to stop there (1.27x at
0.4, 0.79x at 0.1). transformers' own loop adapts its threshold too
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
threshold of ``GRID`` if it models ``MIN_GAIN`` more than the one in use (``MIN_GAIN_DOWN`` below it, and only one seen
bin at a time: the chain below the threshold in use was never seen, a step down shows it before the next), every
``EVERY`` rounds (``FOLLOW_UP`` after a choice that moved it).

Exactness: the threshold decides how many drafts a round proposes, never what is output (verification judges every
draft). Scope: rounds of one row whose confidences the loop reads on the host anyway (a CPU, no draft constraint:
``SpeculativeEngine._draft``), so it adds no device read; elsewhere the configured threshold holds. What a drafter's
calls showed is kept per (drafter, target, setting) for its later calls (the engine's per-drafter memory,
``engine.stop_models``). ``drafter.adapt_confidence_threshold = False``
keeps the configured threshold.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GRID", "MIN_GAIN", "MIN_GAIN_DOWN", "MIN_OUTCOMES", "MIN_ROUNDS", "StopModel", "adapts", "bin_of"]

# Thresholds the choice ranges over (never 0: a stop that is off would read no more confidences to learn from); the
# confidence bins' edges.
GRID = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
BINS = len(GRID) + 1
PRIOR_DRAFTS = 2.0  # each bin's (and each chain row's) prior: this many drafts at the pooled rate / distribution
MIN_OUTCOMES = 32  # judged drafts before the first choice
MIN_ROUNDS = 8  # timed rounds before the first choice
MIN_GAIN = 1.02  # a higher threshold replaces the one in use only for this much more modelled tokens per second
# ... and a lower one only for this much: below the threshold in use the model is optimistic. Measured on pair G
# (machine F, 2026-12-07, 48-token calls): its E[accepted] ran 10-17% above the rounds' own at every threshold (the
# budget cuts each call's last round; rejections cluster beyond what the chain's bins carry), which favours long
# rounds: with 1.02 both ways it went on down to 0.05 (1.69x) where it had settled at 0.1 before (1.79x).
MIN_GAIN_DOWN = 1.05
EVERY = 16  # rounds between choices once settled (a choice is ~0.13 ms of numpy: amortised over near-free rounds)
FOLLOW_UP = 2  # rounds before the next choice after one that moved the threshold (a job of short calls learns fast)
KEEP_DRAFTS, KEEP_ROUNDS = 4096, 256  # counts are halved past this many drafts; timed rounds kept


def bin_of(c: float) -> int:
    """The confidence bin of ``c``: how many of ``GRID``'s thresholds it reaches (a stop at GRID[i] ends the round
    after a draft of bin <= i)."""
    return bisect.bisect_right(GRID, c)


# _GOES_ON[i]: per bin, whether drafting goes on after a draft of it under a threshold of bin_of == i
_GOES_ON = np.array([[float(b >= i) for b in range(BINS)] for i in range(BINS + 1)])


@dataclass
class StopModel:
    """What one (drafter, target, setting)'s rounds showed, and the threshold they chose. Counts are plain lists
    (a round's record is a few list updates: the loop pays it every round); the choice makes arrays of them."""

    threshold: float | None = None  # the latest choice (None: none made yet)
    first: list = field(default_factory=lambda: [0.0] * BINS)  # first drafts' bins
    chain: list = field(default_factory=lambda: [0.0] * (BINS * BINS))  # [i * BINS + j]: bin i's next draft in j
    judged: list = field(default_factory=lambda: [0.0] * BINS)  # judged drafts per bin
    hits: list = field(default_factory=lambda: [0.0] * BINS)  # accepted drafts per bin
    judged_drafts: float = 0.0
    timed: deque = field(default_factory=lambda: deque(maxlen=KEEP_ROUNDS))  # (forwards, s, positions, s)
    sums: list = field(default_factory=lambda: [0.0] * 6)  # of the timed: forwards, s, positions, s, m^2, m s
    rounds_since: int = 0
    moved: bool = False  # the latest choice moved the threshold: the next comes after FOLLOW_UP rounds, not EVERY

    def record(self, confidences: list[float], accepted: int, forwards: int, draft_seconds: float,
               positions: int, verify_seconds: float, timed: bool = True) -> None:
        """One row's round: the confidences of its proposed drafts in order, how many were accepted, and (``timed``)
        its drafter forwards and verify positions with their seconds."""
        if confidences:
            bins = [bin_of(c) for c in confidences]
            self.first[bins[0]] += 1
            for i, j in zip(bins, bins[1:]):
                self.chain[i * BINS + j] += 1
            judged = bins[: accepted + 1]  # the accepted ones and the first rejected (if any)
            for k, b in enumerate(judged):
                self.judged[b] += 1
                if k < accepted:
                    self.hits[b] += 1
            self.judged_drafts += len(judged)
            if self.judged_drafts > KEEP_DRAFTS:  # older rounds count half: the record follows the text
                for counts in (self.first, self.chain, self.judged, self.hits):
                    counts[:] = [x / 2 for x in counts]
                self.judged_drafts /= 2
        if timed and forwards:
            if len(self.timed) == self.timed.maxlen:
                self._add(self.timed[0], -1.0)
            entry = (forwards, draft_seconds, positions, verify_seconds)
            self.timed.append(entry)
            self._add(entry, 1.0)
        self.rounds_since += 1

    def _add(self, entry: tuple, sign: float) -> None:
        """The timed rounds' running sums (``costs`` reads them: no pass over the rounds per choice)."""
        f, d, m, v = entry
        for k, x in enumerate((f, d, m, v, m * m, m * v)):
            self.sums[k] += sign * x

    def acceptance(self) -> np.ndarray:
        """a(bin): each bin's accepted share of its judged drafts, shrunk towards the overall rate."""
        hits, judged = np.array(self.hits), np.array(self.judged)
        overall = (hits.sum() + 1) / (judged.sum() + 2)
        return (hits + PRIOR_DRAFTS * overall) / (judged + PRIOR_DRAFTS)

    def transitions(self) -> np.ndarray:
        """T[i, j]: the next draft's bin after a draft of bin i, each row shrunk towards the pooled distribution."""
        chain, first = np.array(self.chain).reshape(BINS, BINS), np.array(self.first)
        pooled = (chain.sum(axis=0) + first + 1) / (chain.sum() + first.sum() + BINS)
        return (chain + PRIOR_DRAFTS * pooled) / (chain.sum(axis=1, keepdims=True) + PRIOR_DRAFTS)

    def costs(self) -> tuple[float, float, float]:
        """(t_d, v0, v1): a draft step's seconds and a verify of m positions' v0 + v1 m (v0, v1 >= 0)."""
        forwards, drafting, sum_m, sum_s, sum_mm, sum_ms = self.sums
        n = len(self.timed)
        mean_m, mean_s = sum_m / n, sum_s / n
        var = sum_mm - n * mean_m * mean_m
        cov = sum_ms - n * mean_m * mean_s
        v1 = max(0.0, cov / var) if var > 1e-9 * max(1.0, sum_mm) else 0.0
        return drafting / forwards, max(0.0, mean_s - v1 * mean_m), v1

    def expected(self, thresholds, cap: int) -> tuple[np.ndarray, np.ndarray]:
        """(E[drafts], E[accepted]) of a round at each of ``thresholds`` with at most ``cap`` drafts."""
        go = np.array([_GOES_ON[bin_of(t)] for t in thresholds])  # where drafting goes on after a draft
        first = np.array(self.first)
        pi0 = (first + 1) / (first.sum() + BINS)
        a, T = self.acceptance(), self.transitions()
        G = len(thresholds)
        x = np.concatenate([np.tile(pi0, (G, 1)), np.tile(pi0 * a, (G, 1))])  # rows: d_k per threshold, then e_k
        go, total = np.concatenate([go, go]), x.copy()
        for _ in range(cap - 1):
            x = (x * go) @ T
            x[G:] *= a
            total += x
        sums = total.sum(axis=1)
        return sums[:G], sums[G:]

    def rates(self, thresholds, cap: int) -> np.ndarray:
        """Modelled tokens per second of rounds at each of ``thresholds`` (see the module docstring)."""
        t_d, v0, v1 = self.costs()
        drafts, accepted = self.expected(thresholds, cap)
        return (1.0 + accepted) / (t_d * drafts + v0 + v1 * (1.0 + drafts))

    def due(self) -> bool:
        """Whether the engine should choose again: EVERY rounds since the last choice (FOLLOW_UP after a move)."""
        return self.rounds_since >= (FOLLOW_UP if self.moved else EVERY)

    def ready(self) -> bool:
        return self.judged_drafts >= MIN_OUTCOMES and len(self.timed) >= MIN_ROUNDS

    def choose(self, current: float, cap: int) -> float:
        """The threshold to draft with next: where the modelled rate is highest among ``GRID`` if it beats
        ``current``'s by ``MIN_GAIN`` (above ``current``: what the rounds showed) or ``MIN_GAIN_DOWN`` (below it: one
        step at a time, to where drafts of one more bin that drafts were seen in go on, their chain row the prior
        until then); else ``current`` (also while the records are too few)."""
        self.rounds_since = 0
        if not self.ready():
            return current
        rates = self.rates([current, *GRID], cap)
        best = int(np.argmax(rates[1:]))
        gain = rates[1 + best] / rates[0]
        chosen = current
        if GRID[best] > current and gain > MIN_GAIN:
            chosen = GRID[best]
        elif GRID[best] < current and gain > MIN_GAIN_DOWN:
            seen = [f + sum(self.chain[j::BINS]) for j, f in enumerate(self.first)]
            b = bin_of(current) - 1  # the highest seen bin below the threshold in use (empty bins skipped)
            while b > 0 and not seen[b]:
                b -= 1
            chosen = max(GRID[best], GRID[max(b - 1, 0)])
        self.threshold, self.moved = chosen, chosen != current
        return chosen


def adapts(assistant) -> bool:
    """Whether a call with this drafter adapts its confidence threshold (``drafter.adapt_confidence_threshold``,
    on unless set False)."""
    return bool(getattr(assistant, "adapt_confidence_threshold", True))
