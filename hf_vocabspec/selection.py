"""Choosing the kept vocabulary size k: Optuna TPE over k under a minimum-coverage constraint.

The top-k tokens by assistant-token count are kept; C(k) is their share of counted assistant tokens
(:meth:`TokenCounts.coverage_curve`, computed once and cached, so a trial costs microseconds and 100
trials take about a second). Two objectives:

- ``"throughput"`` (the DEFAULT): the predicted walltime gain of speculative decoding (Leviathan et al.)
  ``(1 - a^(L+1)) / ((1 - a)(L*c + 1))`` with ``L = num_draft_tokens``, per-token acceptance
  ``a(k) = acceptance_at_full * C(k)`` (a target token outside the kept set can never be drafted, so
  coverage caps acceptance) and draft/target cost ratio ``c(k) = verify_cost_ratio * cost(k)/cost(V)``.
  It is the default because it is the quantity users want (tokens per second), it prices a coverage loss
  and a cost saving in the same unit, and it has no hand-set weight: with a cheap drafter (small c) it
  keeps a large head, with an expensive one it trims harder, as it should.
- ``"utility"``: the utility of "Balancing Coverage and Draft Latency in Vocabulary Trimming",
  ``U(k) = alpha*C(k) + (1 - alpha)*R(k)``, ``R(k) = 1 - cost(k)/cost(V)``,
  kept to reproduce the paper (alpha=0.5 on its command line); alpha has no principled value.

``cost`` says what a draft step costs at k: a measured :class:`~hf_vocabspec.cost.LatencyCurve`
(preferred: the head is a memory-bound GEMV whose latency is not linear in k and has a floor), a model
config (architecture-aware FLOPs, that paper's latency proxy), or any callable ``k -> cost relative to the full
head``. The result records which was used.

The constraint is Optuna's own (``trial.set_constraint``: feasible when ``min_coverage - C(k) <= 0``),
so TPE learns where the feasible region is instead of seeing a -1 penalty; a fresh study first
evaluates both ends of the feasible range (the smallest feasible k and k_max), so the choice is never
worse than either. Runs are deterministic for a seed. ``storage`` (a file path -> ``JournalStorage(JournalFileBackend(path))``, or an RDB URL) makes a
study resumable and shareable between processes: a second call continues to ``n_trials`` COMPLETE
trials in total and keeps every earlier trial. The default study name is derived from the settings
(objective, constraint, range, seed, cost kind, counts), so a study is never resumed with other
settings; an explicit ``study_name`` whose stored settings differ is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from ._io import first_line
from .configuration import check_confidence_threshold
from .cost import (
    LatencyCurve,
    RoundModel,
    RoundYield,
    draft_flops,
    mean_tokens_per_round,
    simulate_rounds,
    speculative_speedup,
)
from .coverage import TokenCounts

__all__ = [
    "DEFAULT_CONFIDENCE_THRESHOLDS", "OBJECTIVES", "AcceptanceProfile", "RoundYield", "SelectionResult",
    "SelectionTrial", "ThroughputModel", "TuneResult", "TuneTrial", "quiet_optuna", "relative_cost_fn",
    "select_vocabulary", "simulate_rounds", "tune",
]

# confidence thresholds the tuner searches (0: no early stop; 0.4 is transformers' default for assistants)
DEFAULT_CONFIDENCE_THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6)

OBJECTIVES = ("throughput", "utility")


def relative_cost_fn(cost, vocab_size: int, context_length: int = 512) -> tuple[Callable[[int], float], str]:
    """k -> draft-step cost relative to the full head (k = ``vocab_size``), and a label saying where it comes from."""
    if isinstance(cost, LatencyCurve):
        full = cost.predict(vocab_size)
        return (lambda k: cost.predict(k) / full), f"measured latency ({cost.device}, {cost.dtype})"
    if hasattr(cost, "get_text_config") or hasattr(cost, "hidden_size"):
        full = draft_flops(cost, vocab_size, context_length)["total"]
        return (lambda k: draft_flops(cost, k, context_length)["total"] / full), "architecture-aware FLOPs"
    if callable(cost):
        return (lambda k: float(cost(k))), "user-supplied cost function"
    raise ValueError(
        "cost must be a LatencyCurve (hf_vocabspec.cost.measure_draft_latency(drafter, ks)), a model config "
        "(FLOPs), or a callable k -> draft-step cost relative to the full head."
    )


@contextlib.contextmanager
def quiet_optuna():
    """Optuna's per-trial INFO lines off for this block only (its verbosity is process-global: restored after)."""
    import optuna

    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


def _pareto(points) -> list[tuple[int, float, float]]:
    """Non-dominated (k, coverage, cost): no other point has at least the coverage at no more cost (one strictly)."""
    pts = sorted(set(points), key=lambda p: (p[2], -p[1], p[0]))
    front, best = [], -math.inf
    for p in pts:
        if p[1] > best:
            front.append(p)
            best = p[1]
    return front


class SelectionTrial(NamedTuple):
    """One trial of :func:`select_vocabulary`'s study (its value recomputed under the current cost)."""

    number: int
    k: int
    coverage: float
    relative_cost: float  # draft-step cost at k / at the full head
    value: float  # the objective at k


@dataclass
class SelectionResult:
    """The chosen k and the evidence: the study's trials (:class:`SelectionTrial`) and a dense sweep.
    (Plots of it: hf_vocabspec.evaluation.plots.plot_pareto.)"""

    k: int
    coverage: float
    objective: str
    value: float  # the objective at k (predicted speedup for "throughput", U(k) for "utility")
    relative_draft_cost: float  # draft-step cost at k / at the full head
    cost_source: str
    min_coverage: float
    token_ids: torch.Tensor = field(repr=False)  # counts.top_k(k): ids by descending count
    predicted_speedup: float = float("nan")  # end-to-end vs target-only, walltime formula at k
    predicted_speedup_full_head: float = float("nan")  # the same with the untrimmed drafter
    trials: list[SelectionTrial] = field(default_factory=list, repr=False)
    sweep: list[tuple[int, float, float]] = field(default_factory=list, repr=False)  # k, C, cost
    settings: dict = field(default_factory=dict, repr=False)
    study_name: str = ""

    @property
    def predicted_draft_speedup(self) -> float:
        """Draft-step speedup at k over the full head, by the cost model used."""
        return 1.0 / self.relative_draft_cost

    @property
    def pareto(self) -> list[tuple[int, float, float]]:
        """Non-dominated (k, coverage, relative cost) points over the TPE trials AND the dense top-k sweep."""
        return _pareto([(t.k, t.coverage, t.relative_cost) for t in self.trials] + list(self.sweep))

    def to_dict(self) -> dict:
        return {
            "k": self.k, "coverage": self.coverage, "objective": self.objective, "value": self.value,
            "relative_draft_cost": self.relative_draft_cost, "predicted_draft_speedup": self.predicted_draft_speedup,
            "predicted_speedup": self.predicted_speedup, "predicted_speedup_full_head": self.predicted_speedup_full_head,
            "cost_source": self.cost_source, "min_coverage": self.min_coverage, "study_name": self.study_name,
            "settings": self.settings,
            "pareto": [{"k": k, "coverage": c, "relative_cost": r} for k, c, r in self.pareto],
            "trials": [t._asdict() for t in self.trials],
            "token_ids": [int(i) for i in self.token_ids.tolist()],
        }


def _storage(storage):
    if storage is None or not isinstance(storage, (str, Path)):
        return storage  # None (in memory) or an optuna storage object
    s = str(storage)
    if s.startswith(("sqlite:", "postgresql:", "mysql:")):
        return s
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(s).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(s))


@contextlib.contextmanager
def _reading_storage(storage):
    """A damaged study file fails in one line naming it (optuna's JSONDecodeError/KeyError say nothing of the file)."""
    try:
        yield
    except Exception as err:
        if storage is None or not isinstance(storage, (str, Path)) or isinstance(err, _OurStudyError):
            raise
        raise ValueError(f"The study storage {str(storage)!r} could not be read ({first_line(err, 150, with_type=True)}): "
                         "it is damaged or edited; delete it to start afresh, or pass another storage.") from err


class _OurStudyError(ValueError):
    """A study refused by our own checks (other settings, params outside the search): passed through as is."""


def _run_study(name: str, storage, sampler, settings: dict, settings_key: str, objective, n_trials: int, *,
               anchors: Sequence[dict] = ()) -> list:
    """The one Optuna study set-up of :func:`select_vocabulary` and :func:`tune`: create the study ``name`` in
    ``storage`` (None: in memory) or resume it, refuse one stored with other ``settings`` (kept in its user
    attribute ``settings_key``), enqueue ``anchors`` in a fresh study, and run ``objective`` (maximized) until
    ``n_trials`` trials are COMPLETE. Returns the COMPLETE trials by number; a damaged storage fails in one line."""
    import optuna

    complete = (optuna.trial.TrialState.COMPLETE,)
    with quiet_optuna(), _reading_storage(storage):
        study = optuna.create_study(direction="maximize", study_name=name, storage=_storage(storage),
                                    load_if_exists=True, sampler=sampler)
        stored = study.user_attrs.get(settings_key)
        study.get_trials(deepcopy=False)
        plain = json.loads(json.dumps(settings))
        if stored is None:
            study.set_user_attr(settings_key, settings)
        elif stored != plain:
            diff = sorted(k for k in set(stored) | set(plain) if stored.get(k) != plain.get(k))
            raise _OurStudyError(f"Study {name!r} in this storage was run with other settings or measurements "
                                 f"({', '.join(diff)}): pass another study_name (or leave it unset to derive one "
                                 "from the settings).")
        if anchors and not study.get_trials(deepcopy=False):
            for params in anchors:
                study.enqueue_trial(params)
        done = len(study.get_trials(deepcopy=False, states=complete))
        if done < n_trials:
            study.optimize(objective, n_trials=n_trials - done,
                           callbacks=[optuna.study.MaxTrialsCallback(n_trials, states=complete)])
    return sorted(study.get_trials(deepcopy=False, states=complete), key=lambda t: t.number)


def _check_stored_params(storage, finished, valid) -> None:
    bad = [t.number for t in finished if not valid(t.params)]
    if bad:
        raise _OurStudyError(f"The study storage {str(storage)!r} holds trials outside this search (trial {bad[0]}: "
                             f"{finished[[t.number for t in finished].index(bad[0])].params}): it was edited or "
                             "damaged; delete it to start afresh, or pass another storage.")


def select_vocabulary(
    counts: TokenCounts,
    cost=None,
    *,
    min_coverage: float = 0.95,
    objective: str = "throughput",
    alpha: float = 0.5,
    n_trials: int = 100,
    seed: int = 42,
    k_range: tuple[int, int] = (50, 50000),
    storage=None,
    study_name: str | None = None,
    acceptance_at_full: float = 0.98,
    num_draft_tokens: int = 5,
    verify_cost_ratio: float = 0.5,
    context_length: int = 512,
) -> SelectionResult:
    """Search k with seeded TPE subject to ``coverage(k) >= min_coverage``; see the module docstring.

    ``cost``: LatencyCurve | model config | callable k -> relative draft cost (required).
    ``verify_cost_ratio``: c(V), the cost of one draft step with the FULL head divided by one target
    verification call (measure it: a 270M bf16 drafter on a 270M fp32 target costs ~0.7 on a CPU without
    bf16 units; a 1B drafter for an 8B target ~0.15). Only the throughput objective uses it, with
    ``acceptance_at_full`` (acceptance of the untrimmed drafter) and ``num_draft_tokens`` (L, the draft length:
    ``num_assistant_tokens`` in transformers' generate).
    ``storage``: a file path (journal) or RDB URL makes the study resumable; ``k_range`` is clipped to
    the counted vocabulary. Raises ValueError when no k in range reaches ``min_coverage``.
    """
    import optuna

    if cost is None:
        raise ValueError("Pass cost=: a LatencyCurve (measure_draft_latency), a model config, or a callable k -> cost.")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}; got {objective!r}.")
    if not 0 < min_coverage <= 1:
        raise ValueError(f"min_coverage must be in (0, 1]; got {min_coverage}.")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}.")
    if n_trials < 1:
        raise ValueError(f"n_trials must be >= 1; got {n_trials}.")
    if counts.num_tokens == 0:
        raise ValueError("No tokens were counted: count a dataset with assistant turns first.")
    lo, hi = max(1, int(k_range[0])), min(int(k_range[1]), counts.vocab_size)
    if lo > hi:
        raise ValueError(f"Empty k_range {tuple(k_range)} for a counted vocabulary of {counts.vocab_size}.")
    best_cov = counts.coverage(hi)
    if best_cov < min_coverage:
        k_best = counts.smallest_k_for_coverage(best_cov) if best_cov > 0 else hi
        full_cov = counts.coverage(counts.vocab_size)
        widen = (f"or widen k_range to reach k={counts.smallest_k_for_coverage(min_coverage):,}"
                 if full_cov >= min_coverage else f"(even the full vocabulary only reaches {full_cov:.2%})")
        raise ValueError(
            f"No k in [{lo}, {hi}] reaches coverage {min_coverage:.2%}: the best is {best_cov:.2%} at k={k_best}. "
            f"Lower min_coverage (to at most {math.floor(best_cov * 1e4) / 1e4}) {widen}."
        )
    rel_cost, source = relative_cost_fn(cost, counts.vocab_size, context_length)
    curve = counts.coverage_curve().tolist()  # cached; a plain list makes a trial a few list lookups

    def cov(k: int) -> float:
        return curve[min(k, len(curve)) - 1] if k > 0 else 0.0

    def value_of(k: int) -> tuple[float, float, float]:
        c, r = cov(k), float(rel_cost(k))
        if objective == "utility":
            v = alpha * c + (1 - alpha) * (1 - r)
        else:
            v = speculative_speedup(acceptance_at_full * c, num_draft_tokens, verify_cost_ratio * r)
        return c, r, v

    settings = {
        "objective": objective, "min_coverage": min_coverage, "k_range": [lo, hi], "seed": seed,
        "cost_kind": source, "counts": [counts.vocab_size, counts.num_tokens, counts.tokenizer_name],
    }
    if objective == "utility":
        settings["alpha"] = alpha
    else:
        settings.update(acceptance_at_full=acceptance_at_full, num_draft_tokens=num_draft_tokens,
                        verify_cost_ratio=verify_cost_ratio)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    name = study_name or f"hf_vocabspec-{objective}-{digest}"

    def objective_fn(trial: optuna.Trial) -> float:
        k = trial.suggest_int("k", lo, hi, log=True)
        c, r, v = value_of(k)
        trial.set_constraint("coverage", min_coverage - c)
        trial.set_user_attr("coverage", c)
        trial.set_user_attr("relative_cost", r)
        return v

    # Anchor a fresh study at both ends of the feasible range (the smallest feasible k, and k_max, i.e. "barely
    # trim"), so the choice is never worse than either; TPE then searches between.
    anchors = [{"k": a} for a in sorted({max(lo, counts.smallest_k_for_coverage(min_coverage)), hi})[:n_trials]]
    finished = _run_study(name, storage, optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, n_trials)),
                          settings, "hf_vocabspec_settings", objective_fn, n_trials, anchors=anchors)
    # Values recomputed under the current cost (identical to the recorded ones unless the cost was re-measured).
    _check_stored_params(storage, finished, lambda p: isinstance(p.get("k"), int) and lo <= p["k"] <= hi)
    trials = [SelectionTrial(t.number, int(t.params["k"]), *value_of(int(t.params["k"]))) for t in finished]
    feasible = [t for t in trials if t.coverage >= min_coverage]
    if feasible:
        k = max(feasible, key=lambda t: (t.value, -t.k)).k
    else:  # TPE never sampled a feasible k (tiny n_trials): the smallest feasible k
        k = max(lo, counts.smallest_k_for_coverage(min_coverage))
    c, r, v = value_of(k)
    sweep_ks = {int(round(x)) for x in torch.logspace(math.log10(lo), math.log10(hi), 200, dtype=torch.float64).tolist()}
    sweep = [(kk, *value_of(kk)[:2]) for kk in sorted(sweep_ks | {lo, hi, k})]
    return SelectionResult(
        k=k, coverage=c, objective=objective, value=v, relative_draft_cost=r, cost_source=source,
        min_coverage=min_coverage, token_ids=counts.top_k(k),
        predicted_speedup=speculative_speedup(acceptance_at_full * c, num_draft_tokens, verify_cost_ratio * r),
        predicted_speedup_full_head=speculative_speedup(acceptance_at_full * cov(counts.vocab_size),
                                                      num_draft_tokens, verify_cost_ratio * float(rel_cost(counts.vocab_size))),
        trials=trials, sweep=sweep, settings=settings, study_name=name,
    )


# --- joint tuning of kept size k, draft length L and context tokens (issue #15) ------------------------------
@dataclass
class AcceptanceProfile:
    """Per-position expected acceptance of the ideal trimmed drafter at kept sizes ``ks`` (one workload, one mode).

    ``vanilla[t, i]`` / ``context[t, i]`` are the expected acceptance at scored position t with the top-``ks[i]``
    kept ids, without / with context tokens (hf_vocabspec.evaluation.acceptance's exact scorer, kept per
    position): 1[argmax p drafted] under greedy, the draftable mass of p under sampling. ``segments`` are the
    positions per conversation, in order. ``agreement`` is the real (untrimmed) drafter's measured acceptance
    against the target at the full vocabulary; the ideal drafter's acceptance is scaled by it.
    """

    ks: list[int]
    vanilla: torch.Tensor
    context: torch.Tensor | None
    segments: list[int]
    mode: str = "greedy"
    agreement: float = 1.0
    # True: tau from speculative ROUNDS chained along each segment (a round starts where the previous one
    # stopped, i.e. right after a rejection; cost.simulate_rounds), what generation does; for per-position
    # acceptances of the REAL trimmed drafter (evaluation.tune.drafter_acceptance_profile). False: the mean over
    # every start position (cost.mean_tokens_per_round).
    chained_rounds: bool = False
    # greedy, real drafter: its probability of its own draft at each position (the quantity transformers'
    # assistant_confidence_threshold compares), same shape as vanilla / context; None: thresholds not searchable
    vanilla_confidence: torch.Tensor | None = None
    context_confidence: torch.Tensor | None = None

    def __post_init__(self):
        if self.vanilla.ndim != 2 or self.vanilla.shape[1] != len(self.ks):
            raise ValueError(f"vanilla must be (positions, {len(self.ks)}) for ks={self.ks}; got {tuple(self.vanilla.shape)}.")
        if sum(self.segments) != self.vanilla.shape[0]:
            raise ValueError(f"segments sum to {sum(self.segments)} but there are {self.vanilla.shape[0]} positions.")
        if self.context is not None and self.context.shape != self.vanilla.shape:
            raise ValueError("context must have the shape of vanilla (or be None when context tokens do not apply).")
        for name in ("vanilla_confidence", "context_confidence"):
            conf = getattr(self, name)
            if conf is not None and conf.shape != self.vanilla.shape:
                raise ValueError(f"{name} must have the shape of vanilla; got {tuple(conf.shape)}.")
        self._rounds: dict = {}

    @property
    def has_confidence(self) -> bool:
        """Whether confidence thresholds can be simulated (greedy round profiles of the real drafter)."""
        return self.chained_rounds and self.vanilla_confidence is not None

    def round_yield(self, k: int, num_draft_tokens: int, context_tokens: bool = False,
                    confidence_threshold: float = 0.0) -> RoundYield:
        """tau and the draft-count distribution of rounds at (k, L, context tokens, confidence threshold)."""
        key = (k, num_draft_tokens, context_tokens, float(confidence_threshold))
        if key not in self._rounds:
            col = self._column(k, context_tokens)
            if confidence_threshold > 0 and not self.has_confidence:
                raise ValueError("This profile has no drafter confidence: measure it with "
                                 "hf_vocabspec.evaluation.tune.drafter_acceptance_profile(mode='greedy').")
            accept = (self.context if context_tokens else self.vanilla)[:, col].double() * self.agreement
            if not self.chained_rounds:
                tau = mean_tokens_per_round(accept, self.segments, num_draft_tokens)
                self._rounds[key] = RoundYield(tau, {num_draft_tokens: 1.0})
            else:
                conf = self.context_confidence if context_tokens else self.vanilla_confidence
                self._rounds[key] = simulate_rounds(accept, self.segments, num_draft_tokens,
                                                    threshold=float(confidence_threshold),
                                                    confidence=None if conf is None else conf[:, col])
        return self._rounds[key]

    def _column(self, k: int, context_tokens: bool) -> int:
        if k not in self.ks:
            raise ValueError(f"k={k} was not scored; scored kept sizes: {self.ks}.")
        if context_tokens and self.context is None:
            raise ValueError("Context tokens were not scored for this profile (measure it with context_tokens=True).")
        return self.ks.index(k)

    def tau(self, k: int, num_draft_tokens: int, context_tokens: bool = False,
            confidence_threshold: float = 0.0) -> float:
        """tau at (k, L, context tokens, confidence threshold): :func:`~hf_vocabspec.cost.simulate_rounds` along
        each segment for a ``chained_rounds`` profile, else :func:`~hf_vocabspec.cost.mean_tokens_per_round`
        (every start position; unlike the i.i.d. form with the MEAN a, this keeps the runs of easy and hard
        tokens that real text has, which is what makes a longer L pay)."""
        return self.round_yield(k, num_draft_tokens, context_tokens, confidence_threshold).tau

    def to_dict(self) -> dict:
        """A summary for reports (tune.json's ``measured.acceptance``; its ``chained_rounds`` key was written as
        ``simulate_rounds`` before issue #29, same meaning)."""
        return {"ks": self.ks, "mode": self.mode, "agreement": self.agreement, "segments": self.segments,
                "chained_rounds": self.chained_rounds,
                "mean_vanilla": self.vanilla.mean(0).tolist(),
                "mean_context": None if self.context is None else self.context.mean(0).tolist(),
                "mean_vanilla_confidence": None if self.vanilla_confidence is None
                else self.vanilla_confidence.mean(0).tolist()}


@dataclass
class ThroughputModel:
    """Predicted tokens/s of speculative decoding at (k, L, context tokens, confidence threshold) from measured
    inputs only.

    tokens/s = tau / E[d * draft_step(k) + verify(d+1)] over the rounds' draft counts d
    (:class:`~hf_vocabspec.cost.RoundModel`; d = L without a confidence threshold, except at a sequence's end)
    with tau and the draft counts from :class:`AcceptanceProfile`, the draft step from a measured
    :class:`~hf_vocabspec.cost.LatencyCurve` and ``forward_seconds[n]`` the target's measured forward over n new
    positions (a verify step at n = L+1; ``forward_seconds[1]`` is its decode step, the target-only baseline;
    counts between measured ones are interpolated; named ``verify_seconds`` before issue #29). Confidence
    thresholds (transformers' ``assistant_confidence_threshold``: stop drafting after an unsure draft) are searched where the profile has the drafter's confidence (greedy); 0 is none.
    Call it with an Optuna trial to use it as an objective in your own study.
    """

    acceptance: AcceptanceProfile
    draft_latency: LatencyCurve
    forward_seconds: dict[int, float]
    draft_lengths: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 6, 8, 10, 12])
    confidence_thresholds: list[float] = field(default_factory=lambda: list(DEFAULT_CONFIDENCE_THRESHOLDS))

    def __post_init__(self):
        self.forward_seconds = {int(n): float(s) for n, s in self.forward_seconds.items()}
        missing = [n + 1 for n in self.draft_lengths if n + 1 not in self.forward_seconds]
        if 1 not in self.forward_seconds or missing:
            raise ValueError(f"forward_seconds needs the decode step (1) and every L+1 searched; missing {[1] * (1 not in self.forward_seconds) + missing}. "
                             "Measure them: hf_vocabspec.verify_head.measure_verify_latency(target, rows=...).")
        self.confidence_thresholds = sorted({0.0, *map(check_confidence_threshold, self.confidence_thresholds)})

    @property
    def context_options(self) -> list[bool]:
        return [False, True] if self.acceptance.context is not None else [False]

    @property
    def threshold_options(self) -> list[float]:
        """The thresholds searched: all of them where the profile has the drafter's confidence, else only 0."""
        return self.confidence_thresholds if self.acceptance.has_confidence else [0.0]

    @property
    def round_model(self) -> RoundModel:
        """The round's costs: draft step from the latency curve, the target's forward by position count."""
        return RoundModel(draft=self.draft_latency, verify=self.forward_seconds)

    def tokens_per_second(self, k: int, num_draft_tokens: int, context_tokens: bool = False,
                          confidence_threshold: float = 0.0) -> float:
        r = self.acceptance.round_yield(k, num_draft_tokens, context_tokens, confidence_threshold)
        return self.round_model.tokens_per_second(r.drafts, k=k, tau=r.tau)

    def speedup(self, k: int, num_draft_tokens: int, context_tokens: bool = False,
                confidence_threshold: float = 0.0) -> float:
        """Predicted speedup over target-only decoding (its decode step is ``forward_seconds[1]``)."""
        r = self.acceptance.round_yield(k, num_draft_tokens, context_tokens, confidence_threshold)
        return self.round_model.speedup(r.drafts, k=k, tau=r.tau)

    def __call__(self, trial) -> float:
        k = trial.suggest_categorical("k", self.acceptance.ks)
        n = trial.suggest_categorical("num_draft_tokens", self.draft_lengths)
        ctx = trial.suggest_categorical("context_tokens", self.context_options)
        t = trial.suggest_categorical("confidence_threshold", self.threshold_options)
        trial.set_user_attr("tau", self.acceptance.tau(k, n, ctx, t))
        return self.tokens_per_second(k, n, ctx, t)

    def grid(self) -> list[tuple[int, int, bool, float]]:
        return [(k, n, c, t) for k in self.acceptance.ks for n in self.draft_lengths for c in self.context_options
                for t in self.threshold_options]


class TuneTrial(NamedTuple):
    """One cell :func:`tune` evaluated, with its predicted tokens/s (recomputed from the model)."""

    k: int
    num_draft_tokens: int
    context_tokens: bool
    confidence_threshold: float
    tokens_per_second: float


@dataclass
class TuneResult:
    """The chosen (k, L, context tokens, confidence threshold), its predicted tokens/s and speedup, every trial
    (:class:`TuneTrial`). (Plots of it: hf_vocabspec.evaluation.plots.plot_tune_heatmap.)"""

    k: int
    num_draft_tokens: int
    context_tokens: bool
    tokens_per_second: float
    speedup: float
    trials: list[TuneTrial] = field(repr=False)
    settings: dict = field(default_factory=dict, repr=False)
    study_name: str = ""
    confidence_threshold: float = 0.0
    weight_quantization: str | None = None  # the drafter's weights the model was measured with (run_tune sets it)

    def to_dict(self) -> dict:
        return {"k": self.k, "num_draft_tokens": self.num_draft_tokens, "context_tokens": self.context_tokens,
                "confidence_threshold": self.confidence_threshold, "weight_quantization": self.weight_quantization,
                "predicted_tokens_per_s": self.tokens_per_second, "predicted_speedup": self.speedup,
                "study_name": self.study_name, "settings": self.settings,
                "trials": [{"k": t.k, "num_draft_tokens": t.num_draft_tokens, "context_tokens": t.context_tokens,
                            "confidence_threshold": t.confidence_threshold, "tokens_per_s": t.tokens_per_second}
                           for t in self.trials]}


def tune(model: ThroughputModel, *, n_trials: int | None = None, seed: int = 42, storage=None,
         study_name: str | None = None) -> TuneResult:
    """Search (k, L, context tokens, confidence threshold) for the most predicted tokens/s with Optuna.

    The space is discrete; when ``n_trials`` is None or covers it, every cell is evaluated (grid sampler) and
    the choice is the exact argmax of the model; otherwise seeded TPE. ``storage`` (journal file path or RDB
    URL) makes the study resumable: a second call continues to ``n_trials`` complete trials and keeps the
    earlier ones. The default study name is derived from the settings and the measured inputs, so a study is
    never resumed with other measurements.
    """
    import optuna

    grid = model.grid()
    total = len(grid)
    n_trials = total if n_trials is None else int(n_trials)
    if n_trials < 1:
        raise ValueError(f"n_trials must be >= 1; got {n_trials}.")
    use_grid = n_trials >= total
    n_trials = min(n_trials, total)
    settings = {
        "ks": model.acceptance.ks, "draft_lengths": model.draft_lengths, "context": model.context_options,
        "confidence_thresholds": model.threshold_options,
        "mode": model.acceptance.mode, "agreement": model.acceptance.agreement, "seed": seed,
        "sampler": "grid" if use_grid else "tpe",
        "inputs": hashlib.sha256(json.dumps([model.acceptance.vanilla.sum().item(), model.acceptance.segments,
                                             None if model.acceptance.context is None else model.acceptance.context.sum().item(),
                                             model.draft_latency.seconds, model.draft_latency.floor_seconds,
                                             sorted(model.forward_seconds.items())]).encode()).hexdigest()[:12],
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    name = study_name or f"hf_vocabspec-tune-{digest}"
    if use_grid:
        sampler = optuna.samplers.GridSampler(
            {"k": model.acceptance.ks, "num_draft_tokens": model.draft_lengths,
             "context_tokens": model.context_options, "confidence_threshold": model.threshold_options}, seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, n_trials))
    finished = _run_study(name, storage, sampler, settings, "hf_vocabspec_tune_settings", model, n_trials)
    cells = set(model.grid())

    def cell(p: dict) -> tuple:
        return (p.get("k"), p.get("num_draft_tokens"), p.get("context_tokens"), p.get("confidence_threshold", 0.0))

    _check_stored_params(storage, finished, lambda p: cell(p) in cells)
    # values recomputed from the model (a stored value is a record, not an input: an edited one changes nothing)
    trials = []
    for t in finished:
        k, n, c, th = cell(t.params)
        trials.append(TuneTrial(int(k), int(n), bool(c), float(th), float(model.tokens_per_second(k, n, c, th))))
    # ties: the smaller head, the shorter draft, no context tokens, no threshold (the plainer setting)
    best = max(trials, key=lambda t: (t.tokens_per_second, -t.k, -t.num_draft_tokens, not t.context_tokens,
                                      -t.confidence_threshold))
    k, n, c, th = best.k, best.num_draft_tokens, best.context_tokens, best.confidence_threshold
    return TuneResult(k, n, c, best.tokens_per_second, model.speedup(k, n, c, th), trials, settings, name,
                      confidence_threshold=th)
