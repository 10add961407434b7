"""``hf-vocabspec tune``: measure what the throughput model needs, search (k, L, context tokens), save the choice.

Measured here, on this machine (the model itself is hf_vocabspec.selection.ThroughputModel, core):
- per-position acceptance of the REAL trimmed drafter at every scored k, with and without context tokens,
  along the target's own greedy continuation of held-out prompts (one teacher-forced forward of each model;
  greedy: proposal accepted or not, sampling: sum min(p, q)), tau for every L by simulating rounds
  (``acceptance="drafter"``, the default of run_tune); or the older model: the ideal trimmed drafter on the
  reference answers scaled by the drafter's scalar agreement (``acceptance="ideal"``, optimistic: it
  predicted tau 8.6 at L=8 on pair G where generation measured 6.4);
- the drafter's step latency per k (cost.measure_draft_latency; with ``compile_draft_step`` its steps compiled, as
  a drafter with ``drafter.compile_draft_step = True`` runs them);
- the target's decode step and its verify forward over L+1 positions, with the verify head on
  (verify_head.measure_verify_latency), and the machine's load before and after.
The chosen L and context setting are saved with the drafter (generation_config.num_assistant_tokens,
config.context_tokens), so ``target.generate(assistant_model=drafter)`` uses them with no extra arguments.
"""

from __future__ import annotations

import copy
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .._io import atomic_write
from ..configuration import check_weight_quantization
from ..coverage import TokenCounts
from ..kernels import auto_drafter_dtype
from ..modeling import apply_weight_quantization
from ..selection import DEFAULT_CONFIDENCE_THRESHOLDS, AcceptanceProfile, ThroughputModel, TuneResult, tune
from ._format import cell as _f
from ._format import plus_minus as _pm
from .plots import plot_tune_heatmap
from .data import Conversation

DEFAULT_COVERAGES = (0.9, 0.95, 0.97, 0.98, 0.99, 0.995)
DEFAULT_DRAFT_LENGTHS = (2, 3, 4, 5, 6, 8, 10, 12)


def _generate_kwargs(mode: str) -> dict:
    """generate() sampling arguments of a mode: greedy, or plain sampling at its temperature (no top-k/top-p)."""
    temp = _temperature(mode)
    return {"do_sample": False} if temp is None else {"do_sample": True, "temperature": temp, "top_k": 0, "top_p": 1.0}


def _temperature(mode: str) -> float | None:
    if mode == "greedy":
        return None
    if mode.startswith("t"):
        try:
            return float(mode[1:])
        except ValueError:
            pass
    raise ValueError(f"mode must be 'greedy' or 't<temperature>' such as 't1' or 't0.7'; got {mode!r}.")


@torch.no_grad()
def acceptance_profile(
    target,
    conversations: Sequence[Conversation],
    counts: TokenCounts,
    ks: Sequence[int],
    *,
    mode: str = "greedy",
    context_tokens: bool = True,
    always_kept: Sequence[int] = (),
    drafter=None,
    progress: Callable | None = None,
) -> AcceptanceProfile:
    """Per-position ideal acceptance at each k (top-k by count, plus ``always_kept`` ids) for ``mode``.

    With ``drafter`` (the untrimmed drafter) its agreement with the target is measured on the same
    positions: argmax match rate (greedy) or mean sum_j min(p_j, q_j) (sampling); else agreement is 1.
    """
    temp = _temperature(mode)
    vocab = int(target.config.get_text_config().vocab_size)
    ks = sorted({min(int(k), vocab) for k in ks})
    ranked = counts.ranked_token_ids()
    rank = torch.full((vocab,), vocab, dtype=torch.long)
    rank[ranked] = torch.arange(ranked.numel())
    always = torch.as_tensor(list(always_kept), dtype=torch.long)
    rank[always] = -1  # kept at every k
    order = torch.argsort(rank)  # ids by rank, always-kept first
    n_always = int((rank < 0).sum())
    k_t = torch.tensor(ks)
    cols_v, cols_c, segments = [], [], []
    agree_sum, n_pos = 0.0, 0
    for conv in progress(conversations) if progress else conversations:
        ids = conv.ids
        n = ids.numel() - conv.answer_start  # positions answer_start-1 .. T-2 predict the answer tokens
        out = target(input_ids=ids[None].to(target.device), logits_to_keep=n + 1).logits[0, :-1].float().cpu()
        rows = torch.arange(conv.answer_start - 1, ids.numel() - 1)
        uniq, inverse = torch.unique(ids, return_inverse=True)
        first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(ids.numel()), reduce="amin")
        seen = first[None, :] <= rows[:, None]  # (positions, distinct ids): id already in the context at t
        if temp is None:
            am = out.argmax(-1)
            kept = rank[am][:, None] < k_t[None, :]
            in_ctx = (seen & (uniq[None, :] == am[:, None])).any(1)
            cols_v.append(kept.double())
            cols_c.append((kept | in_ctx[:, None]).double())
        else:
            p = (out / temp).softmax(-1)
            cum = p.index_select(1, order).cumsum(1)
            kept_mass = cum[:, (k_t + n_always - 1).clamp(max=vocab - 1)]  # always-kept ids come first in order
            pruned_u = rank[uniq][None, :] >= k_t[:, None]  # (ks, distinct ids)
            ctx_mass = torch.einsum("tu,ku->tk", (p[:, uniq] * seen).double(), pruned_u.double())
            cols_v.append(kept_mass.double())
            cols_c.append((kept_mass.double() + ctx_mass).clamp(max=1.0))
        segments.append(n)
        if drafter is not None:
            q_logits = drafter(input_ids=ids[None].to(drafter.device), logits_to_keep=n + 1).logits[0, :-1].float().cpu()
            if temp is None:
                agree_sum += float((q_logits.argmax(-1) == out.argmax(-1)).sum())
            else:
                agree_sum += float(torch.minimum((out / temp).softmax(-1), (q_logits / temp).softmax(-1)).sum())
        n_pos += n
    agreement = agree_sum / max(n_pos, 1) if drafter is not None else 1.0
    return AcceptanceProfile(ks, torch.cat(cols_v), torch.cat(cols_c) if context_tokens else None, segments,
                             mode=mode, agreement=agreement)


@torch.no_grad()
def target_continuations(target, conversations: Sequence[Conversation], max_new_tokens: int = 64,
                         progress: Callable | None = None, *, mode: str = "greedy",
                         seed: int = 0) -> list[Conversation]:
    """Each conversation's prompt followed by the target's own continuation (``max_new_tokens``; greedy, or
    sampled at the mode's temperature, seeded): the path speculative decoding walks, so per-position
    acceptances along it are what generation meets (a greedy path is more predictable than a sampled one)."""
    kwargs = _generate_kwargs(mode)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    out = []
    try:
        for conv in progress(conversations) if progress else conversations:
            prompt = conv.ids[: conv.answer_start][None].to(target.device)
            seq = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                                  **kwargs)[0].cpu()
            if seq.numel() > conv.answer_start:
                out.append(Conversation(seq, conv.answer_start))
    finally:
        torch.random.set_rng_state(generator_state)  # a library call leaves the user's RNG alone
    return out


@torch.no_grad()
def drafter_acceptance_profile(
    target,
    drafter,
    conversations: Sequence[Conversation],
    counts: TokenCounts,
    ks: Sequence[int],
    *,
    mode: str = "greedy",
    context_tokens: bool = True,
    always_kept: Sequence[int] = (),
    progress: Callable | None = None,
) -> AcceptanceProfile:
    """Per-position acceptance of the REAL trimmed drafter at each k, from one teacher-forced forward of the
    target and one of the untrimmed ``drafter`` per conversation (best along :func:`target_continuations`).

    Greedy profiles also keep the drafter's probability of its own draft (over D_t) at each position, so
    confidence-threshold stops (``assistant_confidence_threshold``) are simulated from the same forwards.
    At position t the trimmed drafter drafts over D_t = the top-k kept ids (+ ``always_kept``), plus with context
    tokens the pruned ids already in the sequence before t. Greedy: 1 if argmax of q over D_t is the target's
    argmax. Sampling (``conversations`` should then be the target's SAMPLED continuations, as
    :func:`target_continuations` gives for that mode): speculative sampling emits the target's distribution, and
    given that the token at t is x, the draft there was accepted with probability min(p(x), q(x)) / p(x) =
    min(1, q(x) / p(x)) (q: the drafter's softmax restricted to D_t), independently of other positions given the
    path. Those are the per-position acceptances used: their mean over x ~ p is the familiar sum_j min(p_j, q_j),
    but unlike it they keep that a rejection happens where the drafter underrates the token the path takes, so
    rounds that start after one start in the contexts where they do in generation (the expected-value form was
    optimistic at T=1). The profile chains rounds (``chained_rounds``), so tau for every L, each k and context on
    or off all come from the same two forwards, with no scalar agreement factor.
    """
    temp = _temperature(mode)
    vocab = int(target.config.get_text_config().vocab_size)
    ks = sorted({min(int(k), vocab) for k in ks})
    ranked = counts.ranked_token_ids()
    rank = torch.full((vocab,), vocab, dtype=torch.long)
    rank[ranked] = torch.arange(ranked.numel())
    rank[torch.as_tensor(list(always_kept), dtype=torch.long)] = -1  # kept at every k
    cols_v, cols_c, segments = [], [], []
    conf_v, conf_c = [], []  # greedy: the drafter's probability of its own draft (confidence-threshold stops)
    for conv in progress(conversations) if progress else conversations:
        ids = conv.ids
        n = ids.numel() - conv.answer_start
        p_logits = target(input_ids=ids[None].to(target.device), logits_to_keep=n + 1).logits[0, :-1].float().cpu()
        q_logits = drafter(input_ids=ids[None].to(drafter.device), logits_to_keep=n + 1).logits[0, :-1].float().cpu()
        p_logits, q_logits = p_logits[:, :vocab], q_logits[:, :vocab]
        rows = torch.arange(conv.answer_start - 1, ids.numel() - 1)
        uniq, inverse = torch.unique(ids, return_inverse=True)
        first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(ids.numel()), reduce="amin")
        seen = first[None, :] <= rows[:, None]  # (positions, distinct ids): id already in the context at t
        in_ctx = torch.zeros(n, vocab, dtype=torch.bool)
        in_ctx[:, uniq] = seen
        target_top = p_logits.argmax(-1)
        path = ids[conv.answer_start:]  # the token the path has at each scored position
        p_path = None if temp is None else (p_logits / temp).softmax(-1).gather(1, path[:, None])[:, 0]
        per_k = {False: [], True: []}
        conf_k = {False: [], True: []}
        for k in ks:
            kept = (rank < k)[None, :]
            for ctx in (False, True) if context_tokens else (False,):
                draftable = kept | in_ctx if ctx else kept.expand(n, vocab)
                masked = q_logits.masked_fill(~draftable, float("-inf"))
                if temp is None:
                    per_k[ctx].append((masked.argmax(-1) == target_top).double())
                    conf_k[ctx].append(masked.softmax(-1).amax(-1).double())
                else:  # P(accepted | the token there is x) = min(1, q(x) / p(x)): see the docstring
                    q_path = (masked / temp).softmax(-1).gather(1, path[:, None])[:, 0]
                    per_k[ctx].append((q_path.double() / p_path.double().clamp(min=1e-30)).clamp(max=1.0))
        cols_v.append(torch.stack(per_k[False], 1))
        if context_tokens:
            cols_c.append(torch.stack(per_k[True], 1))
        if temp is None:
            conf_v.append(torch.stack(conf_k[False], 1))
            if context_tokens:
                conf_c.append(torch.stack(conf_k[True], 1))
        segments.append(n)
    return AcceptanceProfile(ks, torch.cat(cols_v), torch.cat(cols_c) if context_tokens else None, segments,
                             mode=mode, agreement=1.0, chained_rounds=True,
                             vanilla_confidence=torch.cat(conf_v) if conf_v else None,
                             context_confidence=torch.cat(conf_c) if conf_c else None)


def load_check(threshold: float = 0.5) -> tuple[float, bool]:
    """(1-minute load average, whether it is above ``threshold`` x the cores): timings taken then are noisy."""
    load = os.getloadavg()[0]
    return load, load > threshold * (os.cpu_count() or 1)


class OtherLoad:
    """CPU time OTHER processes used while a measurement ran, in cores: the machine's busy time (/proc/stat) minus
    this process's own CPU time. The load average counts the measurement itself, so on a 2-core machine a timing
    run that uses both cores always looks "busy" by it. ``cores`` is None where /proc/stat is unavailable."""

    def __init__(self, threshold: float = 0.25):
        self.threshold = threshold
        self.cores: float | None = None

    @staticmethod
    def _machine_busy_seconds() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), self._machine_busy_seconds(), self._own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        busy1, wall = self._machine_busy_seconds(), time.perf_counter() - wall0
        if busy0 is not None and busy1 is not None and wall > 0:
            self.cores = max(0.0, (busy1 - busy0) - (self._own_seconds() - own0)) / wall

    @property
    def busy(self) -> bool:
        """Other processes used more than ``threshold`` x the cores while measuring."""
        return self.cores is not None and self.cores > self.threshold * (os.cpu_count() or 1)


def measure_throughput_model(target, drafter, conversations: Sequence[Conversation], counts: TokenCounts,
                             ks: Sequence[int], **kwargs) -> tuple[ThroughputModel, dict]:
    """Measure acceptance, draft latency per k and verify latency per L+1 (verify head on); returns the model
    and a record of the measurements (load before/after included). Keywords: :func:`measure_throughput`."""
    model, record, _ = measure_throughput(target, drafter, conversations, counts, ks, **kwargs)
    return model, record


def measure_throughput(
    target,
    drafter,
    conversations: Sequence[Conversation],
    counts: TokenCounts,
    ks: Sequence[int],
    *,
    draft_lengths: Sequence[int] = DEFAULT_DRAFT_LENGTHS,
    mode: str = "greedy",
    context_tokens: bool = True,
    always_kept: Sequence[int] = (),
    repeats: int = 7,
    context_length: int = 256,
    acceptance: str = "ideal",
    continuation_tokens: int = 64,
    confidence_thresholds: Sequence[float] = DEFAULT_CONFIDENCE_THRESHOLDS,
    progress: Callable | None = None,
    verify=None,
    continued: bool = False,
    compile_draft_step: bool = False,
) -> tuple[ThroughputModel, dict, object]:
    """:func:`measure_throughput_model`, also returning the target's verify latencies (``VerifyLatency``), which
    a later call takes as ``verify`` to reuse: they do not depend on the drafter, and measuring them again per
    drafter would rank drafters by the target's timing noise. ``continued``: the conversations already end with
    the target's own continuation (``target_continuations``).

    ``acceptance``: "drafter" = the real trimmed drafter's per-position acceptance along the target's greedy
    continuation (``continuation_tokens`` per prompt) with simulated rounds (:func:`drafter_acceptance_profile`);
    "ideal" = the ideal trimmed drafter on the reference answers, scaled by the drafter's scalar agreement.
    ``compile_draft_step``: the draft steps are timed compiled, as ``drafter.compile_draft_step = True`` runs them
    (with generate's compile options; the fast linears then on the heads only, as generate keeps them)."""
    from ..cost import measure_draft_latency
    from ..generation.hooks import draft_compile_options
    from ..verify_head import generate_kernels, measure_verify_latency

    load_before, busy_before = load_check()
    if acceptance == "drafter":
        if not continued:
            conversations = target_continuations(target, conversations, continuation_tokens, mode=mode)
        profile = drafter_acceptance_profile(target, drafter, conversations, counts, ks, mode=mode,
                                             context_tokens=context_tokens, always_kept=always_kept, progress=progress)
    elif acceptance == "ideal":
        profile = acceptance_profile(target, conversations, counts, ks, mode=mode, context_tokens=context_tokens,
                                     always_kept=always_kept, drafter=drafter, progress=progress)
    else:
        raise ValueError(f"acceptance must be 'drafter' or 'ideal'; got {acceptance!r}.")
    widths = tuple(sorted({int(n) + 1 for n in draft_lengths}))
    # the timed part: draft steps per k, verify forwards per L+1, with the linear kernels generate will run
    options = draft_compile_options(target) if compile_draft_step else None
    # the kernels generate runs (compiled steps: the head keeps the fast linears, the body its traced int8 copies)
    with OtherLoad() as others, generate_kernels(target, drafter, compiled_draft=compile_draft_step, head=False):
        curve = measure_draft_latency(drafter, profile.ks, context_length=context_length, repeats=repeats,
                                      compile_options=options)
        if verify is None or not set(widths) <= set(verify.ms):
            verify = measure_verify_latency(target, widths, context_length=context_length, repeats=repeats)
    load_after, _ = load_check()
    busy = others.busy if others.cores is not None else busy_before
    if busy:
        used = f"other processes used {others.cores:.1f}" if others.cores is not None else f"load {load_before:.1f}"
        warnings.warn(f"The machine was busy while timing ({used} of {os.cpu_count()} cores): latencies are "
                      "noisy; re-run tune on a quiet machine.", stacklevel=2)
    forward_seconds = {n: verify.median_ms(n) / 1e3 for n in (1, *widths)}
    model = ThroughputModel(profile, curve, forward_seconds, draft_lengths=sorted({int(n) for n in draft_lengths}),
                            confidence_thresholds=list(confidence_thresholds))
    record = {"acceptance": profile.to_dict(), "acceptance_model": acceptance, "draft_latency": curve.to_dict(),
              "verify_ms": {str(n): verify.median_ms(n) for n in (1, *widths)},
              "verify_decode_ratio": {str(n): verify.ratio(n) for n in widths},
              "verify_kernels": {str(n): k for n, k in verify.kernels.items() if n in widths},
              "load": [load_before, load_after], "other_processes_cores": others.cores, "busy": bool(busy),
              "threads": torch.get_num_threads(), "context_length": context_length,
              "compile_draft_step": bool(compile_draft_step)}
    return model, record, verify


def tune_drafter_weights(target, drafter, conversations, counts: TokenCounts, ks: Sequence[int],
                         weight_quantizations: Sequence[str | None], *, tune_kwargs: dict | None = None,
                         **measure_kwargs) -> dict:
    """Per drafter weights (None = as loaded, "int8", "int4"): a quantized copy of ``drafter``, its measured
    ThroughputModel, record and tuned result. Acceptance and draft latency are measured per weights; the target's
    verify latencies once (they do not depend on the drafter), so the choice is not the target's timing noise."""
    searched, verify = {}, None
    for scheme in dict.fromkeys(check_weight_quantization(s) for s in weight_quantizations):
        candidate = drafter
        if scheme is not None:
            candidate = copy.deepcopy(drafter)
            apply_weight_quantization(list(candidate.modules()), scheme)
        model, record, verify = measure_throughput(target, candidate, conversations, counts, ks, verify=verify,
                                                   **measure_kwargs)
        result = tune(model, **(tune_kwargs or {}))
        result.weight_quantization = scheme
        searched[scheme] = (candidate, model, record, result)
    return searched


def best_weights(searched: dict) -> str | None:
    """The weights with the most predicted tokens/s (ties: the earlier listed, e.g. full precision first)."""
    order = list(searched)
    return max(order, key=lambda s: (searched[s][3].tokens_per_second, -order.index(s)))


def save_tuned_drafter(base_drafter, counts: TokenCounts, result: TuneResult, out_dir, *, tokenizer=None,
                       target_model: str | None = None, extra_selection: dict | None = None,
                       compile_draft_step: bool = False):
    """Trim ``base_drafter`` to the chosen k and save it with the chosen L and context-token setting, and with
    ``compile_draft_step`` on where its steps were timed compiled (the choice holds for a drafter run that way)."""
    from ..configuration import set_draft_length
    from ..trimming import trim_drafter

    selection = {"method": "hf-vocabspec tune (joint k, L, context tokens, confidence threshold, drafter weights)",
                 "k": result.k, "weight_quantization": result.weight_quantization,
                 "coverage": counts.coverage(result.k), "num_draft_tokens": result.num_draft_tokens,
                 "confidence_threshold": result.confidence_threshold,
                 "context_tokens": result.context_tokens, "predicted_speedup": round(result.speedup, 4),
                 "predicted_tokens_per_s": round(result.tokens_per_second, 3), **(extra_selection or {})}
    drafter = trim_drafter(base_drafter, counts.top_k(result.k), tokenizer=tokenizer, target_model=target_model,
                           selection=selection)
    if result.context_tokens and not drafter.supports_context_tokens:
        raise ValueError("The tuned setting uses context tokens but this drafter kept no pruned head rows.")
    if result.weight_quantization is not None:
        drafter.quantize_weights(result.weight_quantization)
    drafter.use_context_tokens = result.context_tokens
    drafter.compile_draft_step = compile_draft_step
    set_draft_length(drafter.generation_config, result.num_draft_tokens, result.confidence_threshold)
    out = Path(out_dir)
    drafter.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return drafter


def run_tune(
    target_name: str,
    drafter_name: str,
    out_dir,
    *,
    dataset: str = "offline:sharegpt",
    count_examples: int = 4000,
    conversations: int = 16,
    coverages: Sequence[float] = DEFAULT_COVERAGES,
    ks: Sequence[int] | None = None,
    draft_lengths: Sequence[int] = DEFAULT_DRAFT_LENGTHS,
    mode: str = "greedy",
    drafter_dtype: torch.dtype | None = None,
    n_trials: int | None = None,
    storage=None,
    seed: int = 42,
    repeats: int = 7,
    save_drafter: bool = True,
    validate_prompts: int = 0,
    validate_draft_lengths: Sequence[int] = (3, 5, 8, 12),
    validate_on: str = "held-out",
    max_new_tokens: int = 64,
    acceptance: str = "drafter",
    confidence_thresholds: Sequence[float] = DEFAULT_CONFIDENCE_THRESHOLDS,
    weight_quantizations: Sequence[str | None] = (None,),
    compile_draft_step: bool = False,
    progress: Callable | None = None,
) -> dict:
    """Count, measure, search, save: writes tune.json, heatmap.png and (by default) the tuned drafter to
    ``out_dir/drafter``; returns the report. With ``validate_prompts`` > 0 the tuned setting is also measured
    next to its neighbours (3 kept sizes x ``validate_draft_lengths``) on that many held-out prompts
    (``validate_on="held-out"``: other prompts than the scored ones, the choice's test), or at the tuned k only on
    the prompts whose continuations were scored (``"scored"``: the simulation's own test, free of prompt-to-prompt
    variance: greedy generation walks exactly the scored path). ``weight_quantizations``: the drafter's weights
    searched (None = as loaded, "int8", "int4": see TrimmedDrafter.quantize_weights); each is measured on its own
    (acceptance AND draft latency) and the one with the most predicted tokens/s is chosen and saved.
    ``compile_draft_step``: draft steps timed (and validated) compiled, as ``drafter.compile_draft_step = True`` runs
    them: the choice is for a drafter used that way, and the tuned drafter is saved with ``compile_draft_step`` on
    (``config.compile_draft_step``: generate then runs its steps compiled; set it False to run them eager).
    ``drafter_dtype``: None = ``kernels.auto_drafter_dtype()`` (bfloat16 on a GPU or a CPU with bf16 hardware)."""
    if validate_on not in ("held-out", "scored"):
        raise ValueError(f"validate_on must be 'held-out' or 'scored'; got {validate_on!r}.")
    from ..coverage import count_assistant_tokens
    from ..trimming import special_token_ids
    from .data import count_split, held_out_conversations
    from .offline import load_chat_dataset, load_model, load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(target_name)
    ds = load_chat_dataset(dataset)
    counted, held_out = count_split(ds, count_examples)
    counts = count_assistant_tokens(counted, tokenizer, progress=False)
    target = load_model(target_name, dtype=torch.float32).eval()
    drafter = load_model(drafter_name, dtype=drafter_dtype or auto_drafter_dtype()).eval()
    vocab = int(target.config.get_text_config().vocab_size)
    if ks is None:
        ks = sorted({counts.smallest_k_for_coverage(c) for c in coverages})
    convs = held_out_conversations(held_out, tokenizer, n=conversations)
    special = special_token_ids(target, tokenizer)
    # context tokens are searched for every drafter (tied: pruned rows from the embedding; untied: the kept
    # context_head that trim_drafter stores by default)
    if acceptance == "drafter":  # the target's own continuations: one per prompt, whatever drafter is scored
        convs = target_continuations(target, convs, max_new_tokens, mode=mode)
    searched = tune_drafter_weights(target, drafter, convs, counts, ks, weight_quantizations, tune_kwargs={
        "n_trials": n_trials, "seed": seed, "storage": storage}, draft_lengths=draft_lengths, mode=mode,
        always_kept=special, repeats=repeats, acceptance=acceptance, continuation_tokens=max_new_tokens,
        confidence_thresholds=confidence_thresholds, progress=progress, continued=True,
        compile_draft_step=compile_draft_step)
    best = best_weights(searched)
    drafter, model, record, result = searched[best]
    report = {"target": target_name, "drafter": drafter_name, "dataset": dataset, "count_examples": len(counted),
              "conversations": len(convs), "mode": mode, "date": time.strftime("%Y-%m-%d %H:%M"),
              "vocab_size": vocab, "coverage": {str(k): counts.coverage(k) for k in model.acceptance.ks},
              "result": result.to_dict(), "measured": record,
              "by_weight_quantization": {str(s): {"result": {k: v for k, v in r.to_dict().items() if k != "trials"},
                                                  "draft_latency": rec["draft_latency"]}
                                         for s, (_, _, rec, r) in searched.items()},
              "grid": [{"k": k, "num_draft_tokens": n, "context_tokens": c, "confidence_threshold": t,
                        "tau": model.acceptance.tau(k, n, c, t),
                        "mean_drafts": model.acceptance.round_yield(k, n, c, t).mean_drafts,
                        "tokens_per_s": model.tokens_per_second(k, n, c, t), "speedup": model.speedup(k, n, c, t)}
                       for k, n, c, t in model.grid()]}
    if validate_prompts:
        from .data import eval_prompts

        if validate_on == "scored":
            prompts = [c.ids[: c.answer_start][None] for c in convs[:validate_prompts]]
            validate_ks = [result.k]
        else:
            prompts = eval_prompts(held_out, tokenizer, start=len(held_out) // 2, n=validate_prompts,
                                   max_prompt_tokens=256)
            validate_ks = neighbour_ks(model.acceptance.ks, result.k, vocab)
        report["validation"] = validate_tuned(
            target, drafter, counts, result, prompts, ks=validate_ks, model=model,
            draft_lengths=validate_draft_lengths, tokenizer=tokenizer, max_new_tokens=max_new_tokens,
            generate_kwargs=_generate_kwargs(mode),
            progress=progress, compile_draft_step=compile_draft_step)
        report["validation"]["validated_on"] = validate_on
    atomic_write(out / "tune.json", lambda p: p.write_text(json.dumps(report, indent=2)))
    plot_tune_heatmap(result, out / "heatmap.png", model)
    if save_drafter:
        save_tuned_drafter(drafter, counts, result, out / "drafter", tokenizer=tokenizer, target_model=target_name,
                           extra_selection={"dataset": dataset, "mode": mode}, compile_draft_step=compile_draft_step)
    return report


def format_tune(report: dict) -> str:
    r = report["result"]
    lines = [(f"tuned for {report['target']} with {report['drafter']} ({report['mode']}, {report['dataset']}): "
              f"k={r['k']:,}, L={r['num_draft_tokens']}, context tokens {'on' if r['context_tokens'] else 'off'}, "
              f"{_threshold_text(r['confidence_threshold'])}, drafter weights {r.get('weight_quantization') or 'as loaded'}; "
              f"predicted {r['predicted_tokens_per_s']:.2f} tokens/s = {r['predicted_speedup']:.2f}x target-only"),
             f"machine load {report['measured']['load'][0]:.1f} -> {report['measured']['load'][1]:.1f}"
             + (f"; other processes used {report['measured']['other_processes_cores']:.2f} cores while timing"
                if report["measured"].get("other_processes_cores") is not None else "")
             + (" (BUSY: noisy)" if report["measured"]["busy"] else ""),
             "verify/decode ratio (verify head on): " + ", ".join(
                 f"L+1={n}: {v:.2f}" for n, v in report["measured"]["verify_decode_ratio"].items())]
    if report["measured"].get("compile_draft_step"):
        lines.append("draft steps timed compiled: the tuned drafter is saved with compile_draft_step on (its steps run "
                     "compiled; the first generate call pays the compiles)")
    schemes = report.get("by_weight_quantization") or {}
    if len(schemes) > 1:
        lines.append("drafter weights: " + "; ".join(
            f"{'as loaded' if s == 'None' else s}: best {x['result']['predicted_speedup']:.2f}x "
            f"(k={x['result']['k']:,} L={x['result']['num_draft_tokens']}, draft step "
            f"{1e3 * x['draft_latency']['floor_seconds']:.1f} ms body)" for s, x in schemes.items()))
    best = sorted(report["grid"], key=lambda g: -g["tokens_per_s"])[:5]
    lines.append("top predicted settings: " + "; ".join(
        f"k={g['k']:,} L={g['num_draft_tokens']} ctx={'on' if g['context_tokens'] else 'off'} "
        f"{_threshold_text(g['confidence_threshold'])} {g['speedup']:.2f}x (tau {g['tau']:.2f})" for g in best))
    return "\n".join(lines)


def _threshold_text(threshold: float) -> str:
    return f"stop below confidence {threshold:g}" if threshold else "no confidence stop"


def neighbour_ks(ks: Sequence[int], k: int, vocab: int) -> list[int]:
    """The tuned k and its two neighbours on the scored list (k/2 or 2k where it is at an end)."""
    ks = sorted(set(ks))
    i = ks.index(k)
    lo = ks[i - 1] if i > 0 else max(1, k // 2)
    hi = ks[i + 1] if i + 1 < len(ks) else min(vocab, 2 * k)
    return sorted({lo, k, hi})


def validate_tuned(
    target,
    base_drafter,
    counts: TokenCounts,
    result: TuneResult,
    prompts: Sequence[torch.LongTensor],
    *,
    ks: Sequence[int],
    draft_lengths: Sequence[int] = (3, 5, 8, 12),
    tokenizer=None,
    max_new_tokens: int = 64,
    repeats: int = 1,
    generate_kwargs: dict | None = None,
    model: ThroughputModel | None = None,
    progress: Callable | None = None,
    compile_draft_step: bool = False,
) -> dict:
    """Measure the tuned (k, L, context, threshold) next to a grid of neighbours (``ks`` x ``draft_lengths`` at a
    constant L, same context setting) and target only, interleaved in one run; returns the rows (with the
    ``model``'s predicted tau, draft count and speedup beside the measured ones) and the tuned setting's rank.
    ``compile_draft_step``: every drafter runs its steps compiled (the warm-up call pays the compiles)."""
    from ..configuration import set_draft_length
    from ..trimming import trim_drafter
    from .benchmark import Method, compare_methods

    def name(k: int, n: int, t: float) -> str:
        return f"k={k} L={n}" + (f" stop<{t:g}" if t else "")

    cells = [(k, n, 0.0) for k in sorted({*map(int, ks), result.k}) for n in sorted(map(int, draft_lengths))]
    tuned_cell = (result.k, result.num_draft_tokens, float(result.confidence_threshold))
    if tuned_cell not in cells:
        cells.append(tuned_cell)
    methods = [Method("target only")]
    drafters: dict = {}
    for k, n, t in cells:
        if k not in drafters:
            # a body of its own per drafter: trim_drafter reuses the base's body, and the benchmark's forward
            # timer hooks each drafter's body once
            drafter = trim_drafter(copy.deepcopy(base_drafter), counts.top_k(k), tokenizer=tokenizer)
            drafter.use_context_tokens = result.context_tokens and drafter.supports_context_tokens
            if result.weight_quantization is not None:
                drafter.quantize_weights(result.weight_quantization)
            drafters[k] = drafter

        def prepare(d=drafters[k], n=n, t=t):  # untimed, before each call: this method's schedule
            set_draft_length(d.generation_config, n, t)
        # each cell's stop as configured (not adapted, generation/confidence.py): what the model predicted for it
        attrs = {"adapt_confidence_threshold": False, **({"compile_draft_step": True} if compile_draft_step else {})}
        methods.append(Method(name(k, n, t), drafters[k], prepare=prepare, attrs=attrs))
    results = compare_methods(target, methods, prompts, max_new_tokens=max_new_tokens, repeats=repeats,
                              generate_kwargs=generate_kwargs, progress=progress)
    base = results["target only"].tokens_per_s
    rows = []
    for k, n, t in cells:
        r = results[name(k, n, t)]
        row = {"method": name(k, n, t), "k": k, "num_draft_tokens": n, "confidence_threshold": t,
               "tokens_per_s": r.tokens_per_s, "speedup": r.tokens_per_s / base if base else None,
               "mean_accepted_length": r.mean_accepted_length,
               "tau_standard_error": r.stats.accepted_length_standard_error, "rounds": r.stats.rounds,
               "mean_drafts": r.stats.proposed / r.stats.rounds if r.stats.rounds else None}
        if model is not None and k in model.acceptance.ks:
            sim = model.acceptance.round_yield(k, n, result.context_tokens, t)
            row.update(predicted_tau=sim.tau, predicted_mean_drafts=sim.mean_drafts,
                       predicted_speedup=model.speedup(k, n, result.context_tokens, t))
        rows.append(row)
    rows.sort(key=lambda row: -row["tokens_per_s"])
    tuned = name(*tuned_cell)
    rank = next(i for i, row in enumerate(rows, 1) if row["method"] == tuned)
    best = rows[0]["tokens_per_s"]
    tuned_tps = rows[rank - 1]["tokens_per_s"]
    return {"tuned": tuned, "rank": rank, "of": len(rows), "context_tokens": result.context_tokens,
            "tuned_vs_best": tuned_tps / best if best else None, "target_only_tokens_per_s": base,
            "predicted_speedup": result.speedup, "rows": rows}


def format_validation(v: dict) -> str:
    lines = [(f"tuned {v['tuned']} (context tokens {'on' if v['context_tokens'] else 'off'}) ranks {v['rank']} of "
              f"{v['of']} measured settings: {v['tuned_vs_best']:.1%} of the best; predicted "
              f"{v['predicted_speedup']:.2f}x, measured {v['rows'][v['rank'] - 1]['speedup']:.2f}x over target only"),
             "| setting | tokens/s | x target only (predicted) | tau measured (+- s.e.) | tau predicted "
             "| predicted / measured | drafts per round measured (predicted) |",
             "|---|---|---|---|---|---|---|"]
    for row in v["rows"]:
        mark = " (tuned)" if row["method"] == v["tuned"] else ""
        tau, pred = row["mean_accepted_length"], row.get("predicted_tau")
        ratio = pred / tau if tau and pred else None
        lines.append(f"| {row['method']}{mark} | {row['tokens_per_s']:.2f} | {_f(row['speedup'], '.2f')} "
                     f"({_f(row.get('predicted_speedup'), '.2f')}) | {_f(tau, '.2f')} "
                     f"{_pm(row.get('tau_standard_error'))} | {_f(pred, '.2f')} | "
                     f"{_f(ratio, '.3f')} | {_f(row.get('mean_drafts'), '.2f')} "
                     f"({_f(row.get('predicted_mean_drafts'), '.2f')}) |")
    return "\n".join(lines)
