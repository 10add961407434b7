"""The cost model: what a draft step costs at kept size k, and the ONE model of a speculative round.

Draft-step cost (used by :func:`hf_vocabspec.selection.select_vocabulary`):

- :func:`draft_flops`: architecture-aware forward FLOPs of one cached decode step, read from any HF
  decoder config (GQA, ``head_dim != hidden/heads``, sliding-window layers, gated or plain MLPs, the
  active experts of a mixture-of-experts layer), with a k-row LM head: the latency proxy of
  "Balancing Coverage and Draft Latency in Vocabulary Trimming".
- :func:`measure_draft_latency` -> :class:`LatencyCurve`: the step actually timed on the device at a
  few k, plus the body-only floor (k=0). FLOPs are only a proxy: at batch 1 the LM head is a
  memory-bound GEMV (it streams k*h weights once per token) whose time is not proportional to its FLOPs
  and sits on top of a floor (the body, plus per-layer framework overhead that dominates small models).
  On the project's 2-core CPU, Gemma-3-270M's head is ~50% of the FLOPs but trimming it to 32k rows
  saved 28% of the step, not 44%. Selection should use the measured curve where it can.

The round (words as in docs/glossary.md; every other module calls these, none has its own copy, which
tests/test_layout.py checks):

- tau, tokens per round: :func:`tokens_per_round` (given, i.i.d. acceptance a, or per-position acceptances),
  its inverse :func:`iid_acceptance`, along scored sequences :func:`mean_tokens_per_round` (every start) and
  :func:`simulate_rounds` (rounds chained as generation runs them, -> :class:`RoundYield`), and an SSD
  round's :func:`ssd_tokens_per_round`.
- time of a round, tokens/s and speedup: :class:`RoundModel` (ordinary and SSD rounds; :class:`SSDProjection`,
  :func:`project_ssd_speedup`), and :func:`speculative_speedup` (Leviathan et al.'s closed form).

Names say their unit: ``*_seconds`` / ``*_s`` are seconds, ``*_ms`` milliseconds; a ``*_step_seconds`` is one
forward (draft step, verify step, decode step).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

import torch

from .modeling import apply_weight_quantization, cache_kwarg, model_body

__all__ = [
    "NON_GATED_MODEL_TYPES", "SSD_BACKUPS", "SSD_COMPUTES", "LatencyCurve", "RoundModel", "RoundYield", "SSDProjection",
    "draft_flops", "head_share", "iid_acceptance", "mean_tokens_per_round", "measure_draft_latency",
    "project_ssd_speedup", "simulate_rounds", "speculative_speedup", "ssd_tokens_per_round", "tokens_per_round",
]

# Model types whose MLP is NOT gated (two matrices, up + down). Every other decoder is assumed gated
# (gate, up, down: Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3, OLMo, SmolLM, Granite, ...), which is what
# modern decoders are; pass ``gated=`` to override.
NON_GATED_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "codegen", "opt", "bloom", "falcon", "mpt", "phi",
    "starcoder2", "biogpt", "xglm", "persimmon", "nemotron", "gpt_oss_dense", "bert", "roberta",
})


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _first(c, *names, default=None):
    for n in names:
        v = getattr(c, n, None)
        if v is not None:
            return v
    return default


def _is_gated(c) -> bool:
    return getattr(c, "model_type", None) not in NON_GATED_MODEL_TYPES


def _layer_types(c, layers: int) -> list[str]:
    """Per-layer attention kind; configs without ``layer_types`` and with a window (Mistral) slide everywhere."""
    types = getattr(c, "layer_types", None)
    if types:
        return list(types[:layers])
    window = getattr(c, "sliding_window", None)
    if window and getattr(c, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * layers
    return ["full_attention"] * layers


def _mlp_flops_per_layer(c, h: int, gated: bool, layers: int) -> list[float]:
    """MLP FLOPs of each layer: dense, or the router + ACTIVE experts (+ shared expert) of an MoE layer."""
    mats = 3 if gated else 2
    inter = _first(c, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", default=4 * h)
    dense = mats * 2 * h * inter
    n_experts = _first(c, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    top = getattr(c, "num_experts_per_tok", None) or 0
    if not (n_experts and top):
        return [float(dense)] * layers
    expert_inter = _first(c, "moe_intermediate_size", default=inter)
    moe = 2 * h * n_experts + top * mats * 2 * h * expert_inter  # router + active experts
    shared = _first(c, "shared_expert_intermediate_size", default=0) or 0
    moe += mats * 2 * h * shared + (2 * h if shared else 0)  # Qwen2-MoE shared expert and its gate
    n_shared = _first(c, "n_shared_experts", default=0) or 0
    moe += n_shared * mats * 2 * h * expert_inter  # DeepSeek-style shared experts
    dense_only = set(getattr(c, "mlp_only_layers", None) or [])
    step = getattr(c, "decoder_sparse_step", None) or 1
    first_dense = getattr(c, "first_k_dense_replace", None) or 0
    out = []
    for i in range(layers):
        is_moe = i not in dense_only and (i + 1) % step == 0 and i >= first_dense
        out.append(float(moe if is_moe else dense))
    return out


def draft_flops(config, k: int | None = None, context_length: int = 512, *, gated: bool | None = None) -> dict[str, float]:
    """Forward FLOPs (2 per multiply-add) of ONE cached decode step (one new token), with a k-row LM head.

    Per layer: q projection ``2*h*(heads*head_dim)``, k and v ``2*h*(kv_heads*head_dim)`` each (GQA),
    o projection ``2*(heads*head_dim)*h``; attention over the cached keys ``2*2*heads*head_dim*keys``
    (scores q.k, then the weighted sum of values), with ``keys = min(context_length, sliding_window)`` on
    sliding layers (``config.layer_types``) and ``context_length`` on full ones; MLP ``3*2*h*I`` when gated
    (gate, up, down) else ``2*2*h*I``, or for an MoE layer the router plus the active experts. The LM head
    is ``2*h*k`` (``k`` defaults to the full vocabulary; tied or untied, same cost). Embedding lookup, norms,
    rotary, softmax and softcapping are O(h) and left out. Multi-head latent attention and linear
    attention are not modelled (counted as ordinary attention).

    ``config`` may be a composite (multimodal) config: its ``get_text_config()`` is used.
    Returns ``{"attention_proj", "attention_ctx", "mlp", "lm_head", "total"}``.
    """
    c = _text_config(config)
    h = c.hidden_size
    nh = c.num_attention_heads
    nkv = getattr(c, "num_key_value_heads", None) or nh
    d = getattr(c, "head_dim", None) or h // nh
    layers = c.num_hidden_layers
    gated = _is_gated(c) if gated is None else gated
    k = c.vocab_size if k is None else int(k)
    if k < 0:
        raise ValueError(f"k must be >= 0 (0 = no head); got {k}.")
    window = getattr(c, "sliding_window", None)

    proj = 2 * h * (nh * d) + 2 * 2 * h * (nkv * d) + 2 * (nh * d) * h  # q, k+v, o
    ctx = 0
    for t in _layer_types(c, layers):
        keys = min(context_length, window) if (t in ("sliding_attention", "chunked_attention") and window) else context_length
        ctx += 2 * 2 * nh * d * keys
    out = {
        "attention_proj": float(proj * layers),
        "attention_ctx": float(ctx),
        "mlp": float(sum(_mlp_flops_per_layer(c, h, gated, layers))),
        "lm_head": float(2 * h * k),
    }
    out["total"] = sum(out.values())
    return out


def head_share(config, k: int | None = None, context_length: int = 512) -> float:
    """Share of one draft step's FLOPs spent in a k-row LM head (k defaults to the full vocabulary)."""
    f = draft_flops(config, k, context_length)
    return f["lm_head"] / f["total"]


# --- tau, tokens per round: its one home (Leviathan et al. 2023 and the per-position forms) -------------------
def tokens_per_round(num_draft_tokens: int | float, *, acceptance: float | Sequence[float] | None = None,
                     tau: float | None = None) -> float:
    """tau, the expected tokens a round yields per sequence (the accepted drafts plus the target's own token).

    Exactly one of: ``tau`` (measured, or from a profile: returned as is); ``acceptance`` as one number a
    (each of the L drafts accepted i.i.d. with probability a: tau = (1 - a^(L+1)) / (1 - a), L + 1 at a = 1);
    or as per-position acceptances a_1..a_L (a_j: the j-th draft is accepted given the ones before it were:
    tau = 1 + sum_j prod_{i<=j} a_i). Acceptances are clipped to [0, 1]."""
    if (tau is None) == (acceptance is None):
        raise ValueError("Pass exactly one of tau= (tokens per round) or acceptance= (per-token acceptance).")
    if tau is not None:
        return float(tau)
    if isinstance(acceptance, (int, float)):
        a, n = min(max(float(acceptance), 0.0), 1.0), num_draft_tokens
        return float(n + 1) if a >= 1 else (1 - a ** (n + 1)) / (1 - a)
    per_position = [min(max(float(a), 0.0), 1.0) for a in acceptance]
    if len(per_position) != num_draft_tokens:
        raise ValueError(f"Pass one acceptance per draft position: got {len(per_position)} for L={num_draft_tokens}.")
    total, run = 1.0, 1.0
    for a in per_position:
        run *= a
        total += run
    return total


def iid_acceptance(tau: float, num_draft_tokens: float) -> float:
    """The per-token acceptance a whose i.i.d. :func:`tokens_per_round` equals ``tau`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        a = (lo + hi) / 2
        if tokens_per_round(num_draft_tokens, acceptance=a) < tau:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


def mean_tokens_per_round(accept: torch.Tensor, segments: Sequence[int], num_draft_tokens: int) -> float:
    """tau averaged over EVERY start position of scored sequences: 1 + mean over t of sum_{j=1..L} prod_{i<j}
    a_{t+i}, i.e. :func:`tokens_per_round` with the per-position acceptances that follow t (windows stay inside
    one segment and are cut at its end). ``accept[t]``: acceptance of the draft for position t; ``segments``:
    positions per sequence, in order. Unlike the i.i.d. form with the MEAN a, this keeps the runs of easy and
    hard tokens that real text has, which is what makes a longer L pay; unlike :func:`simulate_rounds` it
    does not chain rounds (a round starts anywhere, not only right after a rejection)."""
    a = accept.double()
    total, start = 0.0, 0
    for n in segments:
        seg = a[start:start + n]
        start += n
        run = torch.ones(n, dtype=torch.float64)
        for j in range(num_draft_tokens):  # run[t] = prod_{i<=j} a[t+i]; zero once the window leaves seg
            shifted = torch.zeros(n, dtype=torch.float64)
            shifted[: n - j] = seg[j:]
            run = run * shifted
            total += float(run.sum())
    return 1.0 + total / max(a.shape[0], 1)


@dataclass(frozen=True)
class RoundYield:
    """What speculative rounds yield: ``tau`` tokens per round and ``drafts``, the share of rounds that drafted d
    tokens (all L without a confidence threshold, except near a sequence's end)."""

    tau: float
    drafts: dict[int, float]

    @property
    def mean_drafts(self) -> float:
        return sum(d * p for d, p in self.drafts.items())


def simulate_rounds(accept: torch.Tensor, segments: Sequence[int], num_draft_tokens: int, *,
                    confidence: torch.Tensor | None = None, threshold: float = 0.0) -> RoundYield:
    """Speculative rounds run along each segment: ``accept[t]`` is the probability that the draft for position
    t is accepted given that the round reached it (0/1 under greedy). A round starting at s accepts j drafts
    with probability prod_{i<j} a[s+i] x (1 - a[s+j]) (all L: prod of L), yields j + 1 tokens (the target's own
    token at s+j included) and the next round starts at s+j+1. Near a segment's end a round drafts only up to
    its last position but one (generation stops there: the last token is the target's), as transformers does
    under ``max_new_tokens``. A Markov chain over start positions.

    ``threshold`` > 0 (greedy; transformers' ``assistant_confidence_threshold``): drafting stops after a draft
    whose drafter probability ``confidence[t]`` is below it. Along the target's path that is exact; after a
    rejection the drafter goes on along its own path, where its confidence was not observed: it stops there
    at the rate measured over all positions (this moves the draft count, never the tokens)."""
    a = accept.double().tolist()
    stops, go_on = None, 1.0
    if threshold > 0:
        if confidence is None:
            raise ValueError("A confidence threshold needs the drafter's per-position confidence (greedy profiles).")
        conf = confidence.double()
        stops = (conf < threshold).tolist()
        go_on = float((conf >= threshold).double().mean()) if conf.numel() else 1.0
    tokens = rounds = 0.0
    drafts: dict[int, float] = {}

    def add(d: int, p: float) -> None:
        drafts[d] = drafts.get(d, 0.0) + p

    start = 0
    for n in segments:
        seg = a[start:start + n]
        stop = stops[start:start + n] if stops is not None else None
        start += n
        reach = [0.0] * (n + 2)  # probability that a round starts at position s
        reach[0] = 1.0
        for s in range(n):
            w = reach[s]
            if w == 0.0:
                continue
            rounds += w
            max_d = min(num_draft_tokens, n - s - 1)
            survive = w  # probability that the round made draft j with drafts s .. s+j-1 all accepted
            for j in range(max_d + 1):
                if j == max_d:  # every draft accepted
                    tokens += survive * (j + 1)
                    add(j, survive)
                    reach[s + j + 1] += survive
                    break
                acc = seg[s + j]
                if stop is not None and stop[s + j]:  # the drafter stops after this draft: j + 1 drafts
                    tokens += survive * (acc * (j + 2) + (1 - acc) * (j + 1))
                    add(j + 1, survive)
                    reach[s + j + 2] += survive * acc
                    reach[s + j + 1] += survive * (1 - acc)
                    break
                rejected = survive * (1 - acc)
                tokens += rejected * (j + 1)
                reach[s + j + 1] += rejected
                rest = max_d - j - 1  # drafts the drafter may still make past the rejected one
                for m in range(rest):
                    add(j + 1 + m, rejected * (go_on ** m) * (1 - go_on))
                add(max_d, rejected * go_on ** rest)
                survive *= acc
    if not rounds:
        return RoundYield(1.0, {0: 1.0})
    return RoundYield(tokens / rounds, {d: p / rounds for d, p in sorted(drafts.items()) if p > 0})


def ssd_tokens_per_round(tau: float, hit_rate: float, backup: str = "neural") -> float:
    """tau of an SSD round: the ordinary ``tau`` when a miss drafts just in time (backup "neural"); with backup
    "none" a miss round drafts nothing and yields the target's one token: h tau + (1 - h)."""
    if backup not in SSD_BACKUPS:
        raise ValueError(f"backup must be one of {SSD_BACKUPS}; got {backup!r}.")
    h = min(max(hit_rate, 0.0), 1.0)
    return h * tau + (1 - h) if backup == "none" else float(tau)


def speculative_speedup(acceptance: float, num_draft_tokens: int | float, cost_ratio: float) -> float:
    """Expected walltime gain over target-only decoding, tau / (L c + 1) with c = draft step / verify step."""
    a = min(max(acceptance, 0.0), 1 - 1e-9)
    return RoundModel.from_cost_ratio(cost_ratio).speedup(num_draft_tokens, acceptance=a)


@dataclass
class LatencyCurve:
    """Measured seconds of one cached draft step at kept sizes ``ks``; ``floor_seconds`` is the body only (k=0)."""

    ks: list[int]
    seconds: list[float]
    floor_seconds: float
    device: str = "cpu"
    dtype: str = "float32"
    context_length: int = 128
    vocab_size: int | None = None  # full vocabulary of the measured model (rows of its LM head)

    def predict(self, k: float) -> float:
        """Seconds of a draft step with a k-row head: piecewise-linear between the measured points.

        Why not a fitted line ``a + b*k`` (or FLOPs): at batch 1 the head is a memory-bound GEMV. Its time
        is flat while k*h weights fit in cache / one kernel launch dominates, then grows with the bytes
        streamed, with kinks where the GEMV changes regime; and the whole step sits on a floor (the body)
        that no head size removes. Linear interpolation through the measured points, anchored at the
        floor for k=0, follows all of that without assuming a shape. Timing noise can make a bigger head
        look faster; a head never costs less with more rows, so the points are made non-decreasing
        (running maximum) first. Past the last measured k, the last segment's slope is extrapolated.
        """
        xs = [0.0, *map(float, self.ks)]
        ys = [self.floor_seconds]
        for t in self.seconds:
            ys.append(max(ys[-1], t))
        k = float(k)
        if k >= xs[-1]:
            if len(xs) < 2 or xs[-1] == xs[-2]:
                return ys[-1]
            return ys[-1] + (k - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x0 <= k <= x1:
                return y0 + (k - x0) * (y1 - y0) / (x1 - x0) if x1 > x0 else y1
        return ys[0]

    def implausibility(self, tolerance: float = 0.10) -> str | None:
        """Why this measured curve cannot be a head's cost (None when it can): a step with a head faster than
        the body alone, or a smaller head slower than a bigger one, each beyond ``tolerance`` (relative noise).

        A loaded machine produces such curves; predict()'s running maximum would then flatten the cost and
        make every k look equally cheap, so callers re-measure or fall back to the FLOPs model instead."""
        for k, t in zip(self.ks, self.seconds):
            if t < self.floor_seconds * (1 - tolerance):
                return (f"the step with a {k}-row head ({t * 1e3:.1f} ms) is faster than the body alone "
                        f"({self.floor_seconds * 1e3:.1f} ms)")
        for i, (k_small, t_small) in enumerate(zip(self.ks, self.seconds)):
            for k_big, t_big in zip(self.ks[i + 1:], self.seconds[i + 1:]):
                if t_small > t_big * (1 + tolerance):
                    return (f"k={k_small} ({t_small * 1e3:.1f} ms) measured slower than k={k_big} "
                            f"({t_big * 1e3:.1f} ms)")
        return None

    def relative(self, k: float, full: int | None = None) -> float:
        """Draft-step time at k relative to the full head (``full`` defaults to ``vocab_size`` / the last k)."""
        full = full or self.vocab_size or self.ks[-1]
        return self.predict(k) / self.predict(full)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LatencyCurve:
        known = {f.name for f in fields(cls)}
        return cls(**{key: v for key, v in d.items() if key in known})


@torch.no_grad()
def measure_draft_latency(
    model, ks: Sequence[int], *, context_length: int = 128, repeats: int = 15, warmup: int = 2, seed: int = 0,
    compile_options: dict | None = None,
) -> LatencyCurve:
    """Time one cached decode step of ``model``'s body plus a k-row LM head, for each k, and the body alone.

    The engine's eager step cache (``generation.engine.eager_step_cache``: timed steps run what generate runs, the
    lean forward included) is prefilled with ``context_length`` tokens; each timed step runs the body on ONE new
    token and multiplies its last hidden state by the first k rows of the model's LM head (sliced from the weight:
    which rows does not change the time, so no trim is needed), then crops the cache back so every step sees the
    same context. Sizes are timed round-robin (slow
    drifts of a shared machine hit every k alike); each size reports the median of ``repeats``.
    Works on a plain causal LM or a :class:`~hf_vocabspec.modeling.TrimmedDrafter` (then k <= its kept size).
    A model whose layers were quantized (``apply_weight_quantization``) is timed with its k-row heads quantized
    the same way, as a trimmed head of it would run.

    ``compile_options`` (torch.compile options, ``generation.hooks.draft_compile_options``): the body's step runs
    as a drafter with ``compile_draft_step`` runs it, through the engine's compiled call on a static cache of its
    own (``DraftStep.compile``; the heads stay eager), the compile paid in the warm-up steps (not timed).
    """
    body = model_body(model)
    out_layer = model.get_output_embeddings()
    weight = out_layer.weight.detach()
    scheme = getattr(out_layer.__dict__.get("_vocabspec_quantized"), "scheme", None)
    device = weight.device
    vocab = weight.shape[0]
    asked = sorted({int(k) for k in ks if int(k) > 0})
    if not asked:
        raise ValueError("Pass at least one k > 0 (the body-only floor, k=0, is always measured).")
    if asked[-1] > vocab:
        warnings.warn(f"k={asked[-1]} exceeds the model's LM head ({vocab} rows): measuring k={vocab} instead.",
                      stacklevel=2)
    ks = sorted({min(k, vocab) for k in asked})
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, context_length + 1), generator=gen).to(device)
    step_ids = ids[:, context_length:]
    pos = torch.tensor([[context_length]], device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if compile_options is None:  # the engine's eager step cache (the lean forward serves the body there)
        from .generation.engine import eager_step_cache

        cache = eager_step_cache(body.config).cache
        step, back = body, lambda: cache.crop(-1)  # back to context_length tokens
    else:  # the engine's compiled draft step (generation/: its static cache, compiled call and rollback)
        from .generation.draft_step import compiled_call, graph_call, static_columns
        from .generation.engine import static_step_cache
        from .modeling import refresh_weight_quantization

        held = static_step_cache(body.config, static_columns(context_length + 1))
        held.grew(context_length)  # (the prompt, fed below)
        cache = held.cache
        refresh_weight_quantization(body)
        step = graph_call(compiled_call(body, compile_options))

        def back() -> None:  # the step's column written, then the fill level moved back to the prompt's
            held.grew(1)
            held.keep([context_length], context_length)
    cache_kw = {cache_kwarg(body): cache}
    body(input_ids=ids[:, :context_length], use_cache=True, **cache_kw)

    def one_step(head: torch.Tensor | None) -> float:
        sync()
        t0 = time.perf_counter()
        hidden = step(input_ids=step_ids, position_ids=pos, use_cache=True, **cache_kw).last_hidden_state
        if head is not None:
            head(hidden[:, -1])
        sync()
        dt = time.perf_counter() - t0
        back()
        return dt

    def k_rows(k: int) -> torch.nn.Linear:
        head = torch.nn.utils.skip_init(torch.nn.Linear, weight.shape[1], k, bias=False, device=device,
                                        dtype=weight.dtype).requires_grad_(False)
        head.weight.copy_(weight[:k])  # no random init first: the rows are copied in
        if scheme is not None:
            apply_weight_quantization([head], scheme, write_values=False)
        return head

    heads = [None] + [k_rows(k) for k in ks]
    for head in heads:
        for _ in range(warmup):
            one_step(head)
    times: list[list[float]] = [[] for _ in heads]
    for _ in range(repeats):
        for i, head in enumerate(heads):
            times[i].append(one_step(head))
    floor, *seconds = (statistics.median(t) for t in times)
    return LatencyCurve(
        ks, seconds, floor, device=str(device), dtype=str(weight.dtype).removeprefix("torch."),
        context_length=context_length, vocab_size=int(vocab),
    )


# --- one model of a speculative round: its time, its yield, and what it gains over plain decoding ------------
SSD_BACKUPS = ("neural", "none")  # what an SSD miss does: draft just in time, or draft nothing that round
SSD_COMPUTES = ("sync", "dedicated")  # where SSD's tree is built: inline, or on the drafter's own compute


@dataclass(frozen=True)
class RoundModel:
    """Time and yield of one speculative round, the one place the round is modelled.

    A round drafts L tokens (L draft steps at kept size k), verifies them in one target forward over L+1
    positions, and yields tau tokens per sequence (the accepted drafts plus the bonus token). So

        round seconds  = L * draft(k, b) + verify(L+1, b)
        tokens/s       = b * tau / round seconds
        speedup        = tokens/s / (b / decode(b))        (target-only decoding at batch size b)

    Inputs are measured costs, by batch size b (a single value means batch 1):

    - ``draft``: seconds of one draft step: a :class:`LatencyCurve` (cost over kept size k) or a number
      (a fixed head); or a mapping batch size -> either.
    - ``verify``: seconds of the target's forward: a number (the same for every position count: a measured
      verify-step median), a mapping positions -> seconds (batch 1), or (positions, batch) -> seconds
      (positions None: the same for every position count).
    - ``decode``: seconds of one plain (target-only) decode step: a number or batch -> seconds; by default
      ``verify`` at one position.

    Costs may be in any unit (seconds, or multiples of the verify step: :meth:`from_cost_ratio`); speedups
    are unit-free. tau comes from ``tau=`` (measured or from a profile), or ``acceptance=``: one number a
    (each draft accepted i.i.d., tau = (1 - a^(L+1)) / (1 - a)) or per-position acceptances a_1..a_L
    (a_j: the j-th draft is accepted given the ones before it were; tau = 1 + sum_j prod_{i<=j} a_i):
    :func:`tokens_per_round`.

    SSD rounds (speculative speculative decoding, hf_vocabspec.ssd) are modelled here too:
    :meth:`ssd_round_seconds` and :meth:`ssd_speedup` (:func:`project_ssd_speedup` from measured numbers).
    """

    draft: LatencyCurve | float | Mapping[int, LatencyCurve | float]
    verify: float | Mapping[int, float] | Mapping[tuple[int | None, int], float]
    decode: float | Mapping[int, float] | None = None

    # --- constructors --------------------------------------------------------------------------------------
    @classmethod
    def from_cost_ratio(cls, cost_ratio: float) -> RoundModel:
        """Costs in verify steps: a draft step costs ``cost_ratio``, verify and plain decode steps 1."""
        return cls(draft=float(cost_ratio), verify=1.0, decode=1.0)

    @classmethod
    def from_measured(cls, draft_step_s: float, verify_step_s: float, decode_step_s: float | None = None,
                      *, batch_size: int = 1) -> RoundModel:
        """From one run's measured medians at one batch size: draft step, verify step and (target-only)
        decode step. What a decoding loop can time on the fly to decide whether speculating pays
        (:meth:`fallback_reason`)."""
        b = int(batch_size)
        return cls(draft={b: float(draft_step_s)}, verify={(None, b): float(verify_step_s)},
                   decode=None if decode_step_s is None else {b: float(decode_step_s)})

    # --- the costs -------------------------------------------------------------------------------------------
    def draft_step_seconds(self, k: int | None = None, batch_size: int = 1) -> float:
        """One draft step at kept size k (None: the curve's full head) and batch size."""
        d = self.draft
        if isinstance(d, Mapping):
            if batch_size not in d:
                raise ValueError(f"No draft-step cost measured at batch size {batch_size} (measured: {sorted(d)}).")
            d = d[batch_size]
        elif batch_size != 1:
            raise ValueError(f"The draft-step cost was given for batch size 1 only; pass draft={{{batch_size}: ...}}.")
        if isinstance(d, LatencyCurve):
            k = (d.vocab_size or d.ks[-1]) if k is None else k
            return d.predict(k)
        return float(d)

    def verify_step_seconds(self, positions: int | float, batch_size: int = 1) -> float:
        """The target's forward over ``positions`` new positions (L+1 in a round) at batch size; a count between
        two measured ones is interpolated linearly, one outside them is refused (never extrapolated)."""
        v = self.verify
        if not isinstance(v, Mapping):
            if batch_size != 1:
                raise ValueError(f"The verify cost was given for batch size 1 only; pass verify={{(n, {batch_size}): ...}}.")
            return float(v)
        keyed = {key if isinstance(key, tuple) else (int(key), 1): float(s) for key, s in v.items()}
        if (None, batch_size) in keyed:  # positions None: one median for every position count (from_measured)
            return keyed[(None, batch_size)]
        key = (int(round(positions)), batch_size)
        if key[0] == positions and key not in keyed:  # between two measured counts: linear (verify grows smoothly)
            below = [n for n, b in keyed if b == batch_size and n is not None and n < key[0]]
            above = [n for n, b in keyed if b == batch_size and n is not None and n > key[0]]
            if below and above:
                lo, hi = max(below), min(above)
                w = (key[0] - lo) / (hi - lo)
                return (1 - w) * keyed[(lo, batch_size)] + w * keyed[(hi, batch_size)]
        if key not in keyed or key[0] != positions:
            raise ValueError(f"No verify cost measured for {positions} positions at batch size {batch_size} "
                             f"(measured (positions, batch): {sorted(keyed, key=str)}); measure it: "
                             "hf_vocabspec.verify_head.measure_verify_latency(target, rows=...).")
        return keyed[key]

    def decode_step_seconds(self, batch_size: int = 1) -> float:
        """One plain decode step of the target (the target-only baseline)."""
        d = self.decode
        if d is None:
            return self.verify_step_seconds(1, batch_size)
        if isinstance(d, Mapping):
            if batch_size not in d:
                raise ValueError(f"No decode-step cost measured at batch size {batch_size} (measured: {sorted(d)}).")
            return float(d[batch_size])
        if batch_size != 1:
            raise ValueError(f"The decode cost was given for batch size 1 only; pass decode={{{batch_size}: ...}}.")
        return float(d)

    def round_seconds(self, num_draft_tokens: int | float | Mapping[int, float], k: int | None = None,
                      batch_size: int = 1) -> float:
        """L draft steps plus one verify forward over L+1 positions. ``num_draft_tokens`` may be a distribution
        {drafts: probability} for rounds that stop early (a confidence threshold, the sequence's end): the
        expected round time."""
        if isinstance(num_draft_tokens, Mapping):
            total = sum(num_draft_tokens.values())
            return sum(p * self.round_seconds(d, k, batch_size) for d, p in num_draft_tokens.items()) / total
        return (num_draft_tokens * self.draft_step_seconds(k, batch_size)
                + self.verify_step_seconds(num_draft_tokens + 1, batch_size))

    # --- the yield -------------------------------------------------------------------------------------------
    tokens_per_round = staticmethod(tokens_per_round)  # tau: the module's one function, as a method too

    def tokens_per_second(self, num_draft_tokens: int | float | Mapping[int, float], *, k: int | None = None, batch_size: int = 1,
                          acceptance: float | Sequence[float] | None = None, tau: float | None = None) -> float:
        """Tokens per second of speculative decoding, summed over the batch."""
        tau = tokens_per_round(num_draft_tokens, acceptance=acceptance, tau=tau)
        return batch_size * tau / self.round_seconds(num_draft_tokens, k, batch_size)

    def plain_tokens_per_second(self, batch_size: int = 1) -> float:
        """Tokens per second of target-only decoding, summed over the batch."""
        return batch_size / self.decode_step_seconds(batch_size)

    def speedup(self, num_draft_tokens: int | float | Mapping[int, float], *, k: int | None = None, batch_size: int = 1,
                acceptance: float | Sequence[float] | None = None, tau: float | None = None) -> float:
        """Speculative tokens/s over target-only tokens/s at the same batch size."""
        return (self.tokens_per_second(num_draft_tokens, k=k, batch_size=batch_size, acceptance=acceptance, tau=tau)
                / self.plain_tokens_per_second(batch_size))

    def fallback_reason(self, num_draft_tokens: int | float, *, k: int | None = None, batch_size: int = 1,
                        acceptance: float | Sequence[float] | None = None, tau: float | None = None,
                        margin: float = 0.0) -> str | None:
        """One line saying why plain decoding is faster than speculating (predicted speedup below
        ``1 + margin``), or None when speculating pays. For a decoding loop that times its rounds."""
        tau = tokens_per_round(num_draft_tokens, acceptance=acceptance, tau=tau)
        s = self.speedup(num_draft_tokens, k=k, batch_size=batch_size, tau=tau)
        if s >= 1 + margin:
            return None
        b = batch_size
        return (f"speculating does not pay at batch size {b}: a round of {num_draft_tokens:g} drafts costs "
                f"{self.round_seconds(num_draft_tokens, k, b) * 1e3:.3g} ms for {tau:.2f} tokens per sequence, "
                f"plain decoding {self.decode_step_seconds(b) * 1e3:.3g} ms per token (predicted speedup {s:.2f}x)")

    # --- SSD rounds ------------------------------------------------------------------------------------------
    def ssd_round_seconds(self, num_draft_tokens: int | float, *, hit_rate: float, tree_seconds: float,
                          backup: str = "neural", compute: str = "dedicated", k: int | None = None,
                          batch_size: int = 1) -> float:
        """One SSD round: t_v + (1 - h) t_b + s, with h the hit rate, t_b the cost of a miss (L draft steps for
        backup "neural", 0 for "none") and s the part of the tree time t_spec on the critical path: all of it
        when the tree is built inline ("sync"), max(0, t_spec - t_v) when the drafter has its own compute and
        builds the tree while the target verifies ("dedicated")."""
        if compute not in SSD_COMPUTES:
            raise ValueError(f"compute must be one of {SSD_COMPUTES}; got {compute!r}.")
        if backup not in SSD_BACKUPS:
            raise ValueError(f"backup must be one of {SSD_BACKUPS}; got {backup!r}.")
        h = min(max(hit_rate, 0.0), 1.0)
        verify = self.verify_step_seconds(num_draft_tokens + 1, batch_size)
        miss = num_draft_tokens * self.draft_step_seconds(k, batch_size) if backup == "neural" else 0.0
        on_path = tree_seconds if compute == "sync" else max(0.0, tree_seconds - verify)
        return verify + (1 - h) * miss + on_path

    def ssd_speedup(self, num_draft_tokens: int, *, hit_rate: float, tree_seconds: float, tau: float,
                    ssd_tau: float | None = None, backup: str = "neural", compute: str = "dedicated",
                    k: int | None = None, batch_size: int = 1) -> SSDProjection:
        """SSD's speedup over ordinary speculative decoding with the same drafter and L:
        (tau_SSD / T_SSD) / (tau / T_SD), T from :meth:`round_seconds` and :meth:`ssd_round_seconds`, tau_SSD
        from :func:`ssd_tokens_per_round` (``ssd_tau``: the measured SSD tau, e.g. under Saguaro, whose C < 1
        lowers acceptance; default ``tau``). Upper bound, h = 1 and t_spec <= t_v: 1 + L t_d / t_v."""
        sd = self.round_seconds(num_draft_tokens, k, batch_size)
        ssd = self.ssd_round_seconds(num_draft_tokens, hit_rate=hit_rate, tree_seconds=tree_seconds, backup=backup,
                                     compute=compute, k=k, batch_size=batch_size)
        ssd_tau = ssd_tokens_per_round(tau if ssd_tau is None else ssd_tau, hit_rate, backup)
        speedup = (ssd_tau / ssd) / (tau / sd) if ssd > 0 and tau > 0 else float("nan")
        return SSDProjection(speedup, sd, ssd, compute, {"tau_sd": tau, "tau_ssd": ssd_tau})


@dataclass
class SSDProjection:
    """SSD vs ordinary speculative decoding (SD) with the same drafter and L, per :meth:`RoundModel.ssd_speedup`:
    the speedup and both round times (in the costs' unit, seconds for measured ones). PROJECTED unless the run
    really had the assumed compute."""

    speedup: float
    sd_round_seconds: float
    ssd_round_seconds: float
    compute: str  # "sync" | "dedicated"
    measured_inputs: dict = field(default_factory=dict)


def project_ssd_speedup(*, hit_rate: float, draft_step_s: float, verify_step_s: float, tree_s: float,
                        num_draft_tokens: int, tau_sd: float, tau_ssd: float | None = None, backup: str = "neural",
                        compute: str = "dedicated") -> SSDProjection:
    """Projected SSD speedup over ordinary SD from measured h, t_d, t_v, t_spec (seconds) and tau
    (:meth:`RoundModel.ssd_speedup` on :meth:`RoundModel.from_measured`)."""
    model = RoundModel.from_measured(draft_step_s, verify_step_s)
    proj = model.ssd_speedup(num_draft_tokens, hit_rate=hit_rate, tree_seconds=tree_s, tau=tau_sd, ssd_tau=tau_ssd,
                             backup=backup, compute=compute)
    proj.measured_inputs = {"hit_rate": min(max(hit_rate, 0.0), 1.0), "draft_step_s": draft_step_s,
                            "verify_step_s": verify_step_s, "tree_s": tree_s, "num_draft_tokens": num_draft_tokens,
                            "tau_sd": tau_sd, "tau_ssd": proj.measured_inputs["tau_ssd"], "backup": backup}
    return proj
