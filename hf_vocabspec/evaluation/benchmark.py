"""Side-by-side measurement of generation methods: tokens/s, acceptance, mean accepted length, in-situ timing.

Methods are interleaved prompt by prompt and repeated, so slow drifts of a noisy machine hit all methods
alike; only ratios measured in the same run are reported as speedups. Forward hooks time every target and
drafter forward inside those same generate calls (no separate micro-benchmark), so the time split, step
latencies and the zero-cost-drafter limit describe exactly the runs whose tokens/s are reported.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from .._io import atomic_write
from ..configuration import (DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_NUM_ASSISTANT_TOKENS, capped_draft_length,
                             set_draft_length)
from ..cost import RoundModel, iid_acceptance, project_ssd_speedup
from ..generation import SpeculationStats
from ..generation.hooks import compiles_draft_step
from ..hub import EvalResultRow
from ..kernels import (EXACT_ROWS, auto_drafter_dtype, fast_linears, native_bf16, settle_choices, wants_fast_linears,
                       wants_int8_copies)
from ..modeling import TrimmedDrafter
from .data import eval_prompts, first_exchange, load_workload  # noqa: F401 (re-exported)


@dataclass
class Method:
    """One way to generate: target only (assistant None), HF assisted, or a TrimmedDrafter.

    ``attrs`` are set on the assistant right before each of this method's generate calls and restored after,
    so several methods can share one drafter with different runtime switches (``use_context_tokens``, ...).
    """

    name: str
    assistant: torch.nn.Module | None = None
    attrs: dict = field(default_factory=dict)
    prepare: Callable[[], object] | None = None  # called (untimed) before each of this method's calls
    kind: str = ""  # "target", "hf_assisted", "trimmed", "ssd" (derived from the assistant when left empty)
    threads: int | None = None  # torch threads for this method's calls (restored after); None = unchanged
    # target only: run the target's linear layers through hf_vocabspec.kernels.fast_linears (what our generate
    # runs), to tell the kernels' share of a speed-up from speculation's
    fast_linears: bool = False

    def __post_init__(self):
        if not self.kind:
            self.kind = ("target" if self.assistant is None
                         else "trimmed" if isinstance(self.assistant, TrimmedDrafter)
                         else "ssd" if _drafter_of(self.assistant) is not None else "hf_assisted")


def _drafter_of(assistant) -> TrimmedDrafter | None:
    """The TrimmedDrafter behind an assistant: itself, or an hf_vocabspec session's (SSD) drafter."""
    if isinstance(assistant, TrimmedDrafter):
        return assistant
    if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None:
        return getattr(assistant, "drafter", None)
    return None


def generation_config_for(model, **overrides) -> GenerationConfig:
    """ONE GenerationConfig for a generate call: the model's own, ``.update(**overrides)``, passed alone.

    Why: transformers deprecates passing ``generation_config`` together with generation arguments; one
    config per call also says exactly what the call ran with. A key that is not a generation setting is
    refused here rather than silently forwarded to the model's forward."""
    config = copy.deepcopy(model.generation_config)
    unused = config.update(**overrides)
    if unused:
        raise ValueError(f"Not generation settings: {sorted(unused)}; pass them to generate() as model inputs.")
    return config


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch threads, then restore the previous count (None: leave it alone)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class MethodResult:
    name: str
    kind: str = ""  # as Method.kind: rows are found by kind and fields, never by parsing names
    kept_vocab: int | None = None  # trimmed drafters: kept head rows
    context_tokens: bool | None = None  # trimmed drafters: context tokens on for this method
    new_tokens: int = 0
    seconds: float = 0.0
    stats: SpeculationStats = field(default_factory=SpeculationStats)  # summed over this method's calls
    tokens_per_s_runs: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    speculative: bool = False
    # In-situ forward timing (ForwardTimer): prefill totals, and one entry per later step.
    target_prefill_seconds: float = 0.0
    drafter_prefill_seconds: float = 0.0
    target_step_s: list[float] = field(default_factory=list)  # verify forwards (target only: decode forwards)
    draft_step_s: list[float] = field(default_factory=list)  # one per drafted token: body + head

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def rounds(self) -> int:
        return self.stats.rounds

    @property
    def proposed(self) -> int:
        return self.stats.proposed

    @property
    def accepted(self) -> int:
        return self.stats.accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.rounds if self.rounds else None

    @property
    def target_seconds(self) -> float:
        return self.target_prefill_seconds + sum(self.target_step_s)

    @property
    def drafter_seconds(self) -> float:
        return self.drafter_prefill_seconds + sum(self.draft_step_s)

    @property
    def other_seconds(self) -> float:
        """Everything outside model forwards: HF's loop, logits processing, draft sampling, bookkeeping."""
        return self.seconds - self.target_seconds - self.drafter_seconds

    @property
    def target_step_ms(self) -> float | None:
        """Median target forward after prefill: a verify step, or a decode step for target only."""
        return statistics.median(self.target_step_s) * 1e3 if self.target_step_s else None

    @property
    def draft_step_ms(self) -> float | None:
        """Median drafter forward per drafted token."""
        return statistics.median(self.draft_step_s) * 1e3 if self.draft_step_s else None

    @property
    def zero_cost_limit_tokens_per_s(self) -> float | None:
        """tokens/s if everything but the target's forwards (prefill included) were free, at this acceptance.

        Measured, not modelled: new tokens / seconds in target forwards. It drops the drafter AND the
        framework's per-round overhead, so it is an upper bound of what a faster drafter can reach.
        """
        return self.new_tokens / self.target_seconds if self.speculative and self.target_seconds else None

    @property
    def share_of_zero_cost_limit(self) -> float | None:
        """Measured tokens/s / zero-cost limit = share of the time spent in target forwards."""
        limit = self.zero_cost_limit_tokens_per_s
        return self.tokens_per_s / limit if limit else None

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("outputs", "target_step_s", "draft_step_s", "stats"):
            d.pop(key)
        d.update({k: getattr(self.stats, k) for k in ("rounds", "proposed", "accepted", "pruned_proposed",
                                                      "context_proposed")})
        if hasattr(self.stats, "hit_rate"):  # SSD rows (hf_vocabspec.ssd.SSDStats), all measured
            st = self.stats
            d["ssd"] = {"mode": st.mode, "hit_rate": st.hit_rate, "lookups": st.lookups, "tree_ms": st.tree_s * 1e3,
                        "inline_draft_ms_per_token": st.draft_step_s * 1e3, "verify_ms": st.verify_step_s * 1e3,
                        "wait_ms_per_round": st.wait_s / st.rounds * 1e3 if st.rounds else None,
                        "fell_back": st.fell_back, "fallback_reason": st.fallback_reason}
        d.update(tokens_per_s=self.tokens_per_s, acceptance_rate=self.acceptance_rate,
                 mean_accepted_length=self.mean_accepted_length, target_seconds=self.target_seconds,
                 drafter_seconds=self.drafter_seconds, other_seconds=self.other_seconds,
                 target_steps=len(self.target_step_s), draft_steps=len(self.draft_step_s),
                 verify_step_ms=self.target_step_ms if self.speculative else None,
                 decode_step_ms=None if self.speculative else self.target_step_ms,
                 draft_step_ms=self.draft_step_ms, zero_cost_limit_tokens_per_s=self.zero_cost_limit_tokens_per_s,
                 share_of_zero_cost_limit=self.share_of_zero_cost_limit)
        if len(self.tokens_per_s_runs) > 1:
            d["tokens_per_s_median"] = statistics.median(self.tokens_per_s_runs)
            d["tokens_per_s_spread"] = max(self.tokens_per_s_runs) - min(self.tokens_per_s_runs)
        return d


def timing_problem(r: MethodResult) -> str | None:
    """One line when a run's clocks contradict each other, else None: forwards timed inside generate adding
    up to generate's own time or more (then "other" time is negative and the zero-cost limit is not above the
    measured rate). Judged on bench runs, where the clocks mean something; the suite checks the rule on
    given numbers."""
    inside = r.target_seconds + r.drafter_seconds
    if r.seconds > 0 and inside >= r.seconds:
        return (f"{r.name}: forwards timed inside generate ({inside:.3f} s) add up to at least generate's own time "
                f"({r.seconds:.3f} s): the forward timer double counts")
    return None


def speculation_vs_target(r: MethodResult, base: MethodResult) -> dict:
    """Zero-cost-drafter limit vs target only, and the analytic expected speedup (same run).

    ``zero_cost_limit_speedup_vs_target`` = zero-cost limit / measured target-only tokens/s, so that
    measured speedup = limit speedup x ``share_of_zero_cost_limit``.

    ``expected_speedup_theory``: Leviathan et al. (2023), (1 - a^(L+1)) / ((1 - a)(L c + 1)), with L the mean
    drafts per round, c = draft step / verify step (measured medians), times decode step / verify step
    because the formula counts time in verify steps while target only pays (cheaper) decode steps. ``a`` is
    the i.i.d. per-token acceptance whose expected tokens per round (1 - a^(L+1)) / (1 - a) equals the measured
    tau: accepted / proposed is not that a (at a = 0.8, L = 5 it reads 0.54), and plugging it in would
    predict a tau the run did not have. With that a the formula is tau / (L c + 1) x decode / verify
    (:class:`~hf_vocabspec.cost.RoundModel` from the measured steps).
    """
    limit = r.zero_cost_limit_tokens_per_s
    out = {"zero_cost_limit_speedup_vs_target": limit / base.tokens_per_s if limit and base.tokens_per_s else None,
           "draft_verify_cost_ratio": None, "acceptance_iid": None, "expected_speedup_theory": None}
    verify, draft, decode, tau = r.target_step_ms, r.draft_step_ms, base.target_step_ms, r.mean_accepted_length
    if None in (verify, draft, decode, tau) or not r.rounds:
        return out
    drafts = r.proposed / r.rounds
    round_model = RoundModel.from_measured(draft, verify, decode)
    out.update(draft_verify_cost_ratio=draft / verify, acceptance_iid=iid_acceptance(tau, drafts),
               expected_speedup_theory=round_model.speedup(drafts, tau=tau))
    return out


class ForwardTimer:
    """Wall time of every target and drafter forward inside generate, split into prefill and steps.

    Prefill rule: the first forward of each model within one generate call is its prefill (it carries the
    whole prompt; the target's first forward also verifies the first round's drafts, in transformers' assisted
    loop and in hf_vocabspec's engine alike).
    Every later forward of HF's loops and of our draft loop only feeds tokens produced since that model's
    previous forward (at most the draft length + 1), so it is a step whatever the draft schedule; a
    token-count threshold would misfile verify steps once a heuristic schedule grows the draft length.
    A TrimmedDrafter draft step is its body forward plus the trimmed head that follows it (context-token
    rows, draft-space processors and sampling are no module calls: they count as "other"); an HF
    assistant's step is its whole forward. Each drafter forward yields one drafted token.
    """

    def __init__(self, target: torch.nn.Module, assistants: Sequence[torch.nn.Module]):
        self.result: MethodResult | None = None
        self._handles: list = []
        self._started: dict[str, float] = {}
        self._seen: set[str] = set()
        self._drafting_prefill = False
        cuda = next(target.parameters()).is_cuda
        self._sync = torch.cuda.synchronize if cuda else (lambda: None)  # CUDA forwards return before they finish
        self._hook(target, "target")
        for a in {id(a): a for a in assistants}.values():
            if isinstance(a, TrimmedDrafter):
                self._hook(a.model, "draft")
                self._hook(a.lm_head, "head")
            else:
                self._hook(a, "draft")

    def _hook(self, module: torch.nn.Module, role: str) -> None:
        def pre(_module, _args):
            if self.result is not None:
                self._sync()
                self._started[role] = time.perf_counter()

        def post(_module, _args, _output):
            if self.result is not None:
                self._sync()
                self._record(role, time.perf_counter() - self._started.pop(role))

        self._handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def _record(self, role: str, dt: float) -> None:
        r = self.result
        first = role not in self._seen
        self._seen.add(role)
        if role == "target":
            if first:
                r.target_prefill_seconds += dt
            else:
                r.target_step_s.append(dt)
        elif role == "draft":
            self._drafting_prefill = first
            if first:
                r.drafter_prefill_seconds += dt
            else:
                r.draft_step_s.append(dt)
        elif self._drafting_prefill:  # the head of the prefill forward's draft
            r.drafter_prefill_seconds += dt
        else:
            r.draft_step_s[-1] += dt

    @contextlib.contextmanager
    def timing(self, result: MethodResult) -> Iterator[None]:
        """Attribute the forwards of one generate call to ``result``."""
        self.result, self._seen = result, set()
        try:
            yield
        finally:
            self.result = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@contextlib.contextmanager
def applied_attrs(module: torch.nn.Module | None, attrs: dict) -> Iterator[None]:
    """Set a method's runtime switches on its assistant for one generate call; restore (or delete) them after."""
    missing = object()
    saved = {k: getattr(module, k, missing) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                delattr(module, k)
            else:
                setattr(module, k, v)


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


def baseline_mode(kind: str):
    """The grad mode a method's generate calls run in: target-only under ``torch.inference_mode`` (the best baseline a
    user has: transformers' pipelines run it so, and our engine's loop runs so: ``hooks.runs_in_inference_mode``);
    the others under generate's own ``no_grad`` (a null context here). Measured on machine F (2026-12-07, pair G,
    fast linears, 6 ShareGPT prompts x 2): target-only 43.11 s under no_grad, 41.72 s in inference mode."""
    return torch.inference_mode() if kind == "target" else contextlib.nullcontext()


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
    """Generate every prompt with every method (interleaved), ``repeats`` times; return per-method totals.

    Each generate call is also timed forward by forward (:class:`ForwardTimer`), with the method's ``attrs``
    set on its assistant for that call only.
    """
    warm_config = generation_config_for(target, max_new_tokens=4, **(generate_kwargs or {}))
    config = generation_config_for(target, max_new_tokens=max_new_tokens, **(generate_kwargs or {}))
    results = {}
    for m in methods:
        drafter = _drafter_of(m.assistant)
        results[m.name] = MethodResult(
            m.name, kind=m.kind, speculative=m.assistant is not None,
            kept_vocab=drafter.config.draft_vocab_size if drafter is not None else None,
            context_tokens=bool(m.attrs.get("use_context_tokens", drafter.use_context_tokens)) if drafter else None)
        if m.kind == "ssd":
            from ..ssd import SSDStats

            results[m.name].stats = SSDStats(mode=m.assistant.ssd_config.mode)
    steps = [(r, i, m) for r in range(repeats) for i in range(len(prompts)) for m in methods]
    per_run = {(m.name, r): [0, 0.0] for m in methods for r in range(repeats)}
    iterator = progress(steps) if progress else steps
    timer = ForwardTimer(target, list({id(a): a for a in (_drafter_of(m.assistant) or m.assistant for m in methods
                                                            if m.assistant is not None)}.values()))
    try:
        # warm-up (untimed): first calls pay one-off allocation costs
        for m in methods:
            if m.prepare is not None:
                m.prepare()
            with (applied_attrs(_drafter_of(m.assistant) or m.assistant, m.attrs), torch_threads(m.threads),
                  fast_linears(target, enabled=m.fast_linears), baseline_mode(m.kind)):
                # the target's kernel choices for every verify width, made here, not in the timed calls
                drafter = _drafter_of(m.assistant)
                if m.fast_linears or (drafter is not None and wants_fast_linears(m.assistant)):
                    settle_choices(target, range(1, EXACT_ROWS + 1))
                if drafter is not None and wants_fast_linears(m.assistant) and not compiles_draft_step(drafter):
                    # and the drafter's, for its draft steps and context-token feeds (its int8 copies included)
                    settle_choices(drafter, range(1, EXACT_ROWS + 1), draft=True, int8=wants_int8_copies(m.assistant))
                # compiled draft steps: a whole call, so that every step shape compiles here (1- and 2-token feeds)
                whole = compiles_draft_step(_drafter_of(m.assistant))
                target.generate(prompts[0], attention_mask=torch.ones_like(prompts[0]),
                                generation_config=config if whole else warm_config, assistant_model=m.assistant)
        for r, i, m in iterator:
            ids = prompts[i]
            res = results[m.name]
            if m.prepare is not None:
                m.prepare()
            torch.manual_seed(seed + i)
            with (applied_attrs(_drafter_of(m.assistant) or m.assistant, m.attrs), torch_threads(m.threads),
                  fast_linears(target, enabled=m.fast_linears), count_hf_acceptance() as hf_counts,
                  timer.timing(res), baseline_mode(m.kind)):
                t0 = time.perf_counter()
                out = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                      assistant_model=m.assistant)
                dt = time.perf_counter() - t0
            n_new = out.shape[1] - ids.shape[1]
            res.new_tokens += n_new
            res.seconds += dt
            per_run[(m.name, r)][0] += n_new
            per_run[(m.name, r)][1] += dt
            if r == 0:
                res.outputs.append(out[0, ids.shape[1]:].tolist())
            if isinstance(m.assistant, TrimmedDrafter):
                res.stats.add(m.assistant.last_speculation_stats)
            elif m.kind == "ssd":
                res.stats.add(m.assistant.last_stats)
            elif m.assistant is not None:
                res.stats.add(SpeculationStats(**hf_counts))
    finally:
        timer.remove()
    for (name, _r), (n, dt) in per_run.items():
        results[name].tokens_per_s_runs.append(n / dt if dt else 0.0)
    return results


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def _time_split(row: dict) -> str:
    """Shares of wall time in target forwards / drafter forwards / everything else."""
    total = row["seconds"]
    if not total or "target_seconds" not in row:  # reports written before in-situ timing
        return "-"
    return "/".join(f"{row[k] / total:.0%}" for k in ("target_seconds", "drafter_seconds", "other_seconds"))


def method_rows(results: dict[str, MethodResult], baseline: str = "target only",
                hf_assisted: str | None = None) -> dict[str, dict]:
    """JSON rows: each method's totals and timing, speedups vs ``baseline`` (and ``hf_assisted``), zero-cost limit."""
    base = results[baseline]
    rows = {}
    for name, r in results.items():
        row = r.to_dict()
        row["speedup_vs_target"] = median_ratio(r, base)
        if hf_assisted is not None:
            row["speedup_vs_hf_assisted"] = median_ratio(r, results[hf_assisted])
        if r.speculative:
            row.update(speculation_vs_target(r, base))
        row["timing_problem"] = timing_problem(r)
        rows[name] = row
    return rows


_TIMING_HEAD = ("verify ms | draft ms/token | time target/draft/other | zero-cost limit (x target) | share of limit | "
                "theory (x target)")
_TIMING_NOTE = ("verify ms: median target forward per verify round (target only: per decode step, marked d); "
                "draft ms/token: median drafter forward per drafted token; zero-cost limit: tokens/s if only the "
                "target's forwards cost time, over target-only tokens/s; share of limit: measured / limit; theory: "
                "Leviathan et al. expected speedup from tau and the measured step costs.")


def _timing_cells(row: dict) -> str:
    verify = _ms(row.get("verify_step_ms")) if row.get("speculative", True) else f"{_ms(row['decode_step_ms'])} d"
    return (f"{verify} | {_ms(row.get('draft_step_ms'))} | {_time_split(row)} | "
            f"{_x(row.get('zero_cost_limit_speedup_vs_target'))} | {_pct(row.get('share_of_zero_cost_limit'))} | "
            f"{_x(row.get('expected_speedup_theory'))}")


def format_table(results: dict[str, MethodResult], baseline: str | None = None) -> str:
    """Markdown table; speedups are relative to ``baseline`` (same run)."""
    base = results[baseline].tokens_per_s if baseline else None
    rows = method_rows(results, baseline) if baseline else {n: r.to_dict() for n, r in results.items()}
    lines = [
        f"| method | tokens/s | speedup | acceptance | mean accepted length (tau) | {_TIMING_HEAD} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        acc = f"{r.acceptance_rate:.1%}" if r.acceptance_rate is not None else "-"
        tau = f"{r.mean_accepted_length:.2f}" if r.mean_accepted_length is not None else "-"
        speed = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"| {r.name} | {r.tokens_per_s:.1f} | {speed} | {acc} | {tau} | {_timing_cells(rows[r.name])} |")
    return "\n".join(lines) + f"\n\n{_TIMING_NOTE}"


@dataclass
class BenchConfig:
    """One benchmark run: a (target, drafter) pair, vocabulary sizes, workloads and decoding modes."""

    target: str = "offline:gemma-3-270m"
    drafter: str | None = None  # default: reduced-precision copy of the target
    drafter_dtype: str = "bfloat16"
    vocab_dataset: str = "offline:sharegpt"  # the domain the vocabulary is chosen on
    count_examples: int = 4000
    coverages: tuple[float, ...] = (0.9, 0.95, 0.99)
    ks: tuple[int, ...] = ()  # explicit kept sizes (e.g. a selected k and its neighbours), besides coverages
    workloads: tuple[str, ...] = ("offline:sharegpt", "offline:humaneval")
    modes: tuple[str, ...] = ("greedy",)  # "greedy", "t0.7", "t1"
    prompts: int = 3
    max_new_tokens: int = 48
    answer_prefix_tokens: int = 32
    repeats: int = 2
    # L (transformers' num_assistant_tokens) and the confidence stop of every drafting method (HF assisted and
    # trimmed alike): a freshly trimmed drafter's defaults
    num_draft_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS
    confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD
    context_tokens: bool = False  # also run every trimmed k with drafter.use_context_tokens = True
    # what the fast linears contribute: target only with them, and every trimmed method without them
    kernel_levers: bool = False
    # SSD (hf_vocabspec.ssd): per trimmed k, an SSD row with default settings (fallback on) in this mode, next
    # to ordinary speculative decoding at 1 torch thread (the 2-thread row is the trimmed row itself)
    ssd: bool = False
    ssd_mode: str = "worker"
    ssd_fan_out: int = 3
    ssd_saguaro_scale: float = 1.0
    # per trimmed k, a row with the drafter's steps compiled (drafter.compile_draft_step; context tokens as
    # ``context_tokens`` says)
    compile_draft_step: bool = False
    # every trimmed drafter's weights int8 / int4 (drafter.quantize_weights; its method names end with the scheme)
    weight_quantization: str | None = None


_MODES = {"greedy": {"do_sample": False}, "t0.7": {"do_sample": True, "temperature": 0.7, "top_k": 0},
          "t1": {"do_sample": True, "temperature": 1.0, "top_k": 0}}


def run_benchmark(cfg: BenchConfig, out_dir, progress: Callable | None = None) -> dict:
    """Measure every method on every workload and mode; write results.json, results.md and PNG plots."""
    import json
    from pathlib import Path

    from ..coverage import count_assistant_tokens
    from ..trimming import trim_drafter
    from .offline import load_chat_dataset, load_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, cfg.drafter_dtype)
    work = load_workload(cfg.target, cfg.vocab_dataset, cfg.count_examples, progress=progress is not None)
    tokenizer, target, counts, vocab_held_out = work.tokenizer, work.target, work.counts, work.held_out
    drafter_name = cfg.drafter or cfg.target
    full = load_model(drafter_name, dtype=dtype).eval()
    set_draft_length(full.generation_config, cfg.num_draft_tokens, cfg.confidence_threshold)
    methods = [Method("target only"), Method("HF assisted (untrimmed)", full)]
    if cfg.kernel_levers:
        methods.insert(1, Method("target only (fast linears)", fast_linears=True))
    trimmed = []
    sessions = []  # SSD sessions (worker processes), closed at the end
    sizes = [counts.smallest_k_for_coverage(c) for c in cfg.coverages] + list(cfg.ks)
    for k in sorted(set(sizes)):
        d = trim_drafter(load_model(drafter_name, dtype=dtype), counts.top_k(k), tokenizer=tokenizer)
        set_draft_length(d.generation_config, cfg.num_draft_tokens, cfg.confidence_threshold)
        name = f"trimmed k={d.config.draft_vocab_size}"
        if cfg.weight_quantization:
            d.quantize_weights(cfg.weight_quantization)
            name += f" {cfg.weight_quantization}"
        trimmed.append(d)
        methods.append(Method(name, d, attrs={"use_context_tokens": False}))
        if cfg.context_tokens:  # same drafter object, switch flipped per generate call
            methods.append(Method(f"{name} +context", d, attrs={"use_context_tokens": True}))
        if cfg.kernel_levers:
            methods += [Method(f"{m.name} F.linear", d, attrs={**m.attrs, "use_fast_linears": False})
                        for m in methods if m.assistant is d]
        if cfg.compile_draft_step:
            ctx = " +context" if cfg.context_tokens else ""
            methods.append(Method(f"{name}{ctx} compiled steps", d,
                                  attrs={"use_context_tokens": cfg.context_tokens, "compile_draft_step": True}))
        if cfg.ssd:
            methods += _ssd_methods(cfg, name, d, sessions)

    from ..cost import measure_draft_latency
    from .plots import plot_latency_curve

    curve = measure_draft_latency(full, sorted({d.config.draft_vocab_size for d in trimmed} | {len(tokenizer)}))
    plot_latency_curve(curve, out / "draft_latency_vs_vocab.png")
    report = {"config": asdict(cfg), "machine": machine_info(), "full_vocab": len(tokenizer),
              "draft_step_latency": curve.to_dict(), "runs": []}
    for workload in cfg.workloads:
        held_out = vocab_held_out if workload == cfg.vocab_dataset else load_chat_dataset(workload)
        eval_counts = count_assistant_tokens(held_out, tokenizer, progress=False)
        prompts = eval_prompts(held_out, tokenizer, 0, cfg.prompts, 512, cfg.answer_prefix_tokens)
        for mode in cfg.modes:
            res = compare_methods(target, methods, prompts, max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats,
                                  generate_kwargs=_MODES[mode], progress=progress)
            rows = method_rows(res, "target only", "HF assisted (untrimmed)")
            if cfg.ssd:
                ssd_rows(res, rows, methods, capped_draft_length(cfg.num_draft_tokens, cfg.confidence_threshold))
            for m in methods:
                if isinstance(m.assistant, TrimmedDrafter):
                    rows[m.name]["eval_coverage"] = eval_counts.coverage_of(m.assistant.d2t)
            base = res["target only"]
            identical = all(res[m.name].outputs == base.outputs for m in methods) if mode == "greedy" else None
            report["runs"].append({"workload": workload, "in_domain": workload == cfg.vocab_dataset, "mode": mode,
                                   "prompts": len(prompts), "methods": rows, "greedy_identical": identical})
            atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2)))
    for session in sessions:
        session.close()
    atomic_write(out / "results.md", lambda p: p.write_text(format_report(report)))
    plot_report(report, out)
    return report


def _ssd_methods(cfg: BenchConfig, name: str, drafter: TrimmedDrafter, sessions: list) -> list[Method]:
    """SSD row (default settings: the fallback decides) and the 1-thread ordinary row it is also compared with.

    Worker mode splits the cores: the target's process and the drafter worker get one torch thread each
    (SSDConfig.draft_threads), so ordinary speculative decoding is run at 1 thread too; the best of the 1- and
    2-thread ordinary rows is the baseline.
    """
    from ..ssd import SSDConfig, SSDSession

    depth = capped_draft_length(cfg.num_draft_tokens, cfg.confidence_threshold)
    with applied_attrs(drafter, {"use_context_tokens": False}):  # the worker copies the switches at start
        session = SSDSession(drafter, SSDConfig(fan_out=cfg.ssd_fan_out, saguaro_scale=cfg.ssd_saguaro_scale,
                                                mode=cfg.ssd_mode, num_draft_tokens=depth))
    sessions.append(session)
    off = {"use_context_tokens": False}
    return [Method(f"{name} (1 thread)", drafter, attrs=off, threads=1),
            Method(f"{name} SSD {cfg.ssd_mode} F={cfg.ssd_fan_out} C={cfg.ssd_saguaro_scale:g}", session, attrs=off,
                   threads=1 if cfg.ssd_mode == "worker" else None)]


def ssd_rows(res: dict[str, MethodResult], rows: dict[str, dict], methods: Sequence[Method], num_draft_tokens: int):
    """Add to each SSD row: measured speedup over the best ordinary row with the same drafter, and the speedup
    PROJECTED for a drafter with dedicated compute (hf_vocabspec.cost.project_ssd_speedup) from the measured hit
    rate and tree time (SSD row) and the measured draft step, verify step and tau of the ordinary 1-thread row."""
    by_drafter: dict[int, list[Method]] = {}
    for m in methods:
        if m.kind in ("trimmed", "ssd") and not m.attrs.get("use_context_tokens", False):
            by_drafter.setdefault(id(_drafter_of(m.assistant)), []).append(m)
    for group in by_drafter.values():
        ordinary = [m for m in group if m.kind == "trimmed"]
        for m in (m for m in group if m.kind == "ssd"):
            if not ordinary:
                continue
            best = max(ordinary, key=lambda o: res[o.name].tokens_per_s)
            one = next((o for o in ordinary if o.threads == 1), best)
            row, st, base = rows[m.name], res[m.name].stats, res[one.name]
            row["ssd"]["baseline"] = best.name
            row["ssd"]["measured_speedup_vs_sd"] = median_ratio(res[m.name], res[best.name])
            if None in (base.draft_step_ms, base.target_step_ms, base.mean_accepted_length) or not st.trees:
                row["ssd"]["projected_speedup_vs_sd"] = None
                continue
            proj = project_ssd_speedup(hit_rate=st.hit_rate, draft_step_s=base.draft_step_ms / 1e3,
                                   verify_step_s=base.target_step_ms / 1e3, tree_s=st.tree_s,
                                   num_draft_tokens=num_draft_tokens, tau_sd=base.mean_accepted_length,
                                   tau_ssd=res[m.name].mean_accepted_length, compute="dedicated")
            row["ssd"]["projected_speedup_vs_sd"] = proj.speedup
            row["ssd"]["projection_inputs"] = proj.measured_inputs


def median_ratio(r: MethodResult, base: MethodResult) -> dict:
    """Per-repeat tokens/s ratios (same run, interleaved): median and spread."""
    ratios = [a / b for a, b in zip(r.tokens_per_s_runs, base.tokens_per_s_runs) if b]
    if not ratios:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def machine_info() -> dict:
    """Where the numbers were taken: timings only compare within one machine, thread count and library set."""
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "native_bf16": native_bf16(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}


def format_report(report: dict) -> str:
    head = ""
    if mach := report.get("machine"):
        bf16 = {True: ", native bf16", False: ", no native bf16"}.get(mach.get("native_bf16"), "")
        head = (f"Machine: {mach['cpu']} ({mach['cpu_count']} cores{bf16}), {mach['torch_threads']} torch threads, "
                f"torch {mach['torch']}, transformers {mach['transformers']}, {mach['date']}\n\n")
    lat = report.get("draft_step_latency")
    if lat:
        steps = ", ".join(f"k={k:,}: {t * 1e3:.1f} ms" for k, t in zip(lat["ks"], lat["seconds"]))
        head += f"Draft step ({lat['dtype']}, context {lat['context_length']}): {steps}; body-only floor {lat['floor_seconds'] * 1e3:.1f} ms\n\n"
    lines = ["| workload | mode | method | kept vocab | eval coverage | tokens/s | vs target | vs HF assisted | "
             f"acceptance | tau | {_TIMING_HEAD} |", "|---" * 16 + "|"]
    for run in report["runs"]:
        dom = "in-domain" if run["in_domain"] else "out-of-domain"
        for name, row in run["methods"].items():
            vs_t, vs_h = row["speedup_vs_target"], row["speedup_vs_hf_assisted"]
            fmt = lambda d: f"{d['median']:.2f}x ({d['min']:.2f}-{d['max']:.2f})" if d["median"] else "-"  # noqa: E731
            acc = f"{row['acceptance_rate']:.1%}" if row["acceptance_rate"] is not None else "-"
            tau = f"{row['mean_accepted_length']:.2f}" if row["mean_accepted_length"] is not None else "-"
            kv = f"{row['kept_vocab']:,}" if row.get("kept_vocab") is not None else ("full" if row.get("kind") == "hf_assisted" else "-")
            cov = f"{row['eval_coverage']:.1%}" if "eval_coverage" in row else "-"
            lines.append(f"| {run['workload']} ({dom}) | {run['mode']} | {name} | {kv} | {cov} | "
                         f"{row['tokens_per_s']:.2f} | {fmt(vs_t)} | {fmt(vs_h)} | {acc} | {tau} | {_timing_cells(row)} |")
    ssd = [f"- {run['workload']} {run['mode']}, {name}: hit rate {row['ssd']['hit_rate']:.0%} "
           f"({row['ssd']['lookups']} lookups), tree {row['ssd']['tree_ms']:.1f} ms, measured "
           f"{_x((row['ssd'].get('measured_speedup_vs_sd') or {}).get('median'))} vs {row['ssd'].get('baseline', '-')}, "
           f"PROJECTED {_x(row['ssd'].get('projected_speedup_vs_sd'))} with dedicated drafter compute"
           + (f"; fell back: {row['ssd']['fallback_reason']}" if row["ssd"]["fell_back"] else "")
           for run in report["runs"] for name, row in run["methods"].items() if "ssd" in row]
    if ssd:
        ssd = ["", ("SSD (measured on this machine unless marked PROJECTED; an SSD row's draft ms also counts "
                    "sync-mode tree forwards; worker-mode drafter forwards run in another process and are not timed):"),
               *ssd]
    return head + "\n".join(lines) + f"\n\n{_TIMING_NOTE}\n" + "\n".join(ssd) + ("\n" if ssd else "")


def plot_report(report: dict, out_dir) -> None:
    """tokens/s and tau vs kept vocabulary size (full vocabulary = HF assisted), per workload and mode."""
    from matplotlib.figure import Figure  # no pyplot: leaves the user's backend alone

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for run in report["runs"]:
        label = f"{run['workload'].removeprefix('offline:')} {run['mode']}"
        for context in (False, True):  # one line per switch: both share the kept sizes
            pts = sorted((row.get("kept_vocab") or report["full_vocab"], row["tokens_per_s"],
                          row["mean_accepted_length"]) for name, row in run["methods"].items()
                         if row.get("kind") != "target" and name != "target only"
                         and bool(row.get("context_tokens")) == context)
            if context and not pts:
                continue
            ks = [p[0] for p in pts]
            style, tag = ("x--", " +context") if context else ("o-", "")
            axes[0].plot(ks, [p[1] for p in pts], style, label=label + tag)
            axes[1].plot(ks, [p[2] for p in pts], style, label=label + tag)
        axes[0].axhline(run["methods"]["target only"]["tokens_per_s"], ls=":", lw=1, color="gray")
    for ax, yl in zip(axes, ("tokens/s (dotted: target only)", "mean accepted length tau")):
        ax.set_xscale("log")
        ax.set_xlabel("kept vocabulary size (rightmost: untrimmed)")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/throughput_vs_vocab.png", dpi=120)


# --- a report's rows for a drafter's model card (the core's card code takes typed rows; this reads the format) ---
def _is_trimmed_row(name: str, row: dict) -> bool:
    """A bench row of a trimmed drafter: its ``kind`` field (reports before 2026-11-24 only had the name)."""
    return row.get("kind") == "trimmed" if "kind" in row else name.startswith("trimmed k=")


def eval_results_from_benchmark(report: dict | str | os.PathLike, kept_vocab: int | None = None,
                                context_tokens: bool = False) -> list[EvalResultRow]:
    """Eval-result rows (:class:`~hf_vocabspec.hub.EvalResultRow`, for ``push_drafter_to_hub(eval_results=)``)
    from an ``hf-vocabspec bench`` ``results.json`` (a path or the loaded dict).

    Takes the ``trimmed k=<kept_vocab>`` method (the only trimmed one when ``kept_vocab`` is None) of every
    workload x mode run: acceptance rate, mean accepted length, median speedups vs target-only and vs HF
    assisted with the untrimmed drafter, and held-out coverage. (Moved here from hf_vocabspec.hub in issue #29:
    the report is this module's format.)
    """
    if not isinstance(report, dict):
        report = json.loads(Path(report).read_text())
    rows: list[EvalResultRow] = []
    for run in report.get("runs", []):
        methods = run.get("methods", {})
        # "+context" rows are the same drafter with context tokens on: take the rows matching how it ships
        trimmed = {n: m for n, m in methods.items()
                   if _is_trimmed_row(n, m) and bool(m.get("context_tokens")) == context_tokens}
        if kept_vocab is not None:
            trimmed = {n: m for n, m in trimmed.items() if m.get("kept_vocab") == kept_vocab}
        elif len(trimmed) > 1:
            raise ValueError(f"The benchmark has several trimmed sizes ({', '.join(trimmed)}): pass kept_vocab=.")
        for m in trimmed.values():
            where = f"{run['workload']} ({'held-out, ' if run.get('in_domain') else ''}{run['mode']})"
            picks = [("acceptance_rate", "acceptance rate", m.get("acceptance_rate")),
                     ("mean_accepted_length", "mean accepted length (tokens per target step)", m.get("mean_accepted_length")),
                     ("speedup_vs_target", "tokens/s vs target only (median)", (m.get("speedup_vs_target") or {}).get("median")),
                     ("speedup_vs_hf_assisted", "tokens/s vs HF assisted, untrimmed drafter (median)",
                      (m.get("speedup_vs_hf_assisted") or {}).get("median")),
                     ("coverage", "held-out assistant-token coverage", m.get("eval_coverage"))]
            rows += [EvalResultRow(metric_type=t, metric_name=n, metric_value=round(float(v), 4), dataset_name=where)
                     for t, n, v in picks if v is not None]
    if not rows:
        raise ValueError(f"The benchmark report has no run of a trimmed drafter with {kept_vocab} kept tokens: "
                         "benchmark this size (`hf-vocabspec bench --ks K`) or push without it.")
    return rows


def default_drafter_job_args(description: str, prompts: int, output: str, argv: list[str] | None = None,
                             parents: tuple = ()):
    """The parsed options of a bench over a job of prompts with the default drafter (``default_drafter_job``);
    ``parents``: argparse parsers (``add_help=False``) with a script's own options, parsed and listed in --help too."""
    import argparse

    ap = argparse.ArgumentParser(description=description, parents=list(parents),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", default="offline:gemma-3-270m")
    ap.add_argument("--drafter", default="offline:gemma-3-270m")
    ap.add_argument("--dataset", default="offline:sharegpt", help="counted for the kept vocabulary; prompts from its held-out half")
    ap.add_argument("--count-examples", type=int, default=4000)
    ap.add_argument("--coverage", type=float, default=0.95)
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--output", default=output)
    return ap.parse_args(argv)


@dataclass
class DefaultDrafterJob:
    target: torch.nn.Module
    drafter: TrimmedDrafter
    kept_vocab: int
    dtype: torch.dtype
    prompts: list


def default_drafter_job(args) -> DefaultDrafterJob:
    """The target and the default drafter (``trim_drafter`` at ``args.coverage`` of the dataset's counts, no tune),
    both in ``kernels.auto_drafter_dtype`` (bf16 where the CPU has native bf16), and held-out prompts (up to 512
    tokens) of ``default_drafter_job_args``."""
    from ..trimming import trim_drafter
    from .offline import load_model

    dtype = auto_drafter_dtype()  # what `trim --dtype auto` gives (the job's target runs in it too)
    work = load_workload(args.target, args.dataset, args.count_examples)
    k = work.counts.smallest_k_for_coverage(args.coverage)
    drafter = trim_drafter(load_model(args.drafter, dtype=dtype), work.counts.top_k(k), tokenizer=work.tokenizer,
                           target_model=args.target).eval()
    prompts = eval_prompts(work.held_out, work.tokenizer, len(work.held_out) // 2, args.prompts, 512, 32)
    return DefaultDrafterJob(work.target.to(dtype).eval(), drafter, k, dtype, prompts)


def job_rows(results: dict[str, MethodResult], methods: Sequence[Method], reference: str | None = None) -> list[dict]:
    """A row per method of a default-drafter job (``compare_methods``, the first method target-only): its seconds
    and tokens/s, its ratio against the first method in the same run, its mean draft step
    (``stats.draft_seconds / draft_steps``), how many prompts' outputs equal ``reference``'s (default: the first
    method's), and its kernels line."""
    base = results[methods[0].name]
    same = results[reference or methods[0].name]
    rows = []
    for m in methods:
        r = results[m.name]
        rows.append({"method": m.name, "new_tokens": r.new_tokens, "seconds": r.seconds,
                     "tokens_per_second": r.new_tokens / r.seconds if r.seconds else None,
                     "vs_target_only": base.seconds / r.seconds if r.seconds and r.new_tokens == base.new_tokens
                     else None,
                     "draft_ms_per_step": 1e3 * r.stats.draft_seconds / r.stats.draft_steps
                     if r.stats.draft_steps else None,
                     "prompts_identical": sum(a == b for a, b in zip(r.outputs, same.outputs)),
                     "kernels": r.stats.kernels})
    return rows


def drafter_switch_job(description: str, *, switch: str, on: str, off: str, prompts: int, output: str,
                       extra: Callable[[TrimmedDrafter], dict] | None = None, args=None,
                       job: DefaultDrafterJob | None = None) -> dict:
    """A default-drafter job (``default_drafter_job_args`` parse the command line) that times one of the drafter's
    switches on and off, interleaved prompt by prompt in one process (``compare_methods``, one pass): target-only
    with the same fast linears, the default drafter as generate runs it (``on``), and the same drafter with
    ``switch = False`` (``off``). Reports each method's seconds against target-only, its mean draft step and how many
    prompts' outputs equal the switched-on drafter's; ``extra(drafter)`` adds report entries (each also a line).
    Writes results.json / results.md under --output and prints the table. ``args`` / ``job``: already parsed /
    loaded by the caller (a bench that measures more on the same job)."""
    args = args if args is not None else default_drafter_job_args(description, prompts=prompts, output=output)
    job = job if job is not None else default_drafter_job(args)
    methods = [Method("target only (fast linears)", fast_linears=True),
               Method(f"default drafter ({on})", job.drafter),
               Method(f"default drafter ({off})", job.drafter, attrs={switch: False})]
    res = compare_methods(job.target, methods, job.prompts, max_new_tokens=args.max_new_tokens, repeats=1,
                          generate_kwargs={"do_sample": False})
    rows = job_rows(res, methods, reference=methods[1].name)
    info = machine_info()
    more = extra(job.drafter) if extra is not None else {}
    report = {"config": vars(args) | {"kept_vocab": job.kept_vocab, "dtype": str(job.dtype), "switch": switch},
              "machine": info, "rows": rows, **more}
    n = len(job.prompts)
    lines = [f"# {description}: {n} prompts x {args.max_new_tokens} new tokens, {args.target}, k = {job.kept_vocab}, "
             f"{job.dtype}", "", f"machine: {info}", "",
             f"| method | seconds | vs target-only (same run) | draft ms / step | prompts identical to {on} |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['seconds']:.1f} | {r['vs_target_only']:.3f}x | "
              f"{'-' if r['draft_ms_per_step'] is None else format(r['draft_ms_per_step'], '.1f')} | "
              f"{r['prompts_identical']}/{n} |" for r in rows]
    lines += [""] + [f"{key}: {value}" for key, value in more.items()]
    lines += [f"stats.kernels ({on}): {rows[1]['kernels']}", f"stats.kernels ({off}): {rows[2]['kernels']}"]
    write_job_report(Path(args.output), report, lines)
    return report


def write_job_report(out: Path, report: dict, lines: list[str]) -> None:
    """A default-drafter job's results.json and results.md under ``out`` (atomic), and the table printed."""
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2)))
    atomic_write(out / "results.md", lambda p: p.write_text("\n".join(lines) + "\n"))
    print("\n".join(lines))
