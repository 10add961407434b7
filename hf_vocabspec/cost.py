"""What one draft step costs as a function of the kept vocabulary size k: FLOPs, and measured latency.

Two cost models, both used by :func:`hf_vocabspec.selection.select_vocabulary`:

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
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import torch

from .modeling import cache_kwarg, model_body

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


# --- the speculative-decoding formulas (Leviathan et al. 2023); their one home -------------------------------
def expected_accepted_length(acceptance: float | None, num_draft_tokens: int | float = 5) -> float | None:
    """tau: expected tokens per verify round, (1 - a^(L+1)) / (1 - a), when each of L drafts is accepted
    i.i.d. with probability a (counts the bonus token)."""
    if acceptance is None:
        return None
    a, n = min(max(float(acceptance), 0.0), 1.0), num_draft_tokens
    return float(n + 1) if a >= 1 else (1 - a ** (n + 1)) / (1 - a)


def iid_acceptance(tau: float, num_draft_tokens: float) -> float:
    """The per-token acceptance a whose :func:`expected_accepted_length` equals ``tau`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        a = (lo + hi) / 2
        if (1 - a ** (num_draft_tokens + 1)) / (1 - a) < tau:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


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

    def plot(self, path) -> None:
        """PNG: measured step latency vs k (log x), the interpolation, and the body-only floor."""
        from matplotlib.figure import (
            Figure,  # no pyplot: leaves the user's backend alone
        )

        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot(self.ks, [s * 1e3 for s in self.seconds], "o", label="measured: body + k-row head (median)")
        lo, hi = max(1.0, min(self.ks) / 2), max(self.ks)
        grid = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(float(hi))), 200).tolist()
        ax.plot(grid, [self.predict(x) * 1e3 for x in grid], "-", lw=1, color="C0", alpha=0.6,
                label="predict(k): piecewise-linear")
        ax.axhline(self.floor_seconds * 1e3, ls="--", color="gray", label="body-only floor (k=0)")
        ax.set_xscale("log")
        ax.set_xlabel("kept vocabulary size k (LM-head rows)")
        ax.set_ylabel("ms per draft step")
        ax.set_title(f"draft-step latency ({self.device}, {self.dtype}, context {self.context_length})", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)


@torch.no_grad()
def measure_draft_latency(
    model, ks: Sequence[int], *, context_length: int = 128, repeats: int = 15, warmup: int = 2, seed: int = 0
) -> LatencyCurve:
    """Time one cached decode step of ``model``'s body plus a k-row LM head, for each k, and the body alone.

    A ``DynamicCache(config=body_config)`` is prefilled with ``context_length`` tokens; each timed step
    runs the body on ONE new token and multiplies its last hidden state by the first k rows of the
    model's LM head (sliced from the weight: which rows does not change the time, so no trim is needed),
    then crops the cache back so every step sees the same context. Sizes are timed round-robin (slow
    drifts of a shared machine hit every k alike); each size reports the median of ``repeats``.
    Works on a plain causal LM or a :class:`~hf_vocabspec.modeling.TrimmedDrafter` (then k <= its kept size).
    """
    from transformers.cache_utils import DynamicCache

    body = model_body(model)
    weight = model.get_output_embeddings().weight.detach()
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
    cache = DynamicCache(config=body.config)
    cache.activate_past_recording()  # sliding-window layers must be croppable back after each step
    cache_kw = {cache_kwarg(body): cache}
    body(input_ids=ids[:, :context_length], use_cache=True, **cache_kw)
    step_ids = ids[:, context_length:]
    pos = torch.tensor([[context_length]], device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one_step(head: torch.Tensor | None) -> float:
        sync()
        t0 = time.perf_counter()
        hidden = body(input_ids=step_ids, position_ids=pos, use_cache=True, **cache_kw).last_hidden_state
        if head is not None:
            torch.nn.functional.linear(hidden[:, -1], head)
        sync()
        dt = time.perf_counter() - t0
        cache.crop(-1)  # back to context_length tokens
        return dt

    heads = [None] + [weight[:k].contiguous() for k in ks]
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
    (a_j: the j-th draft is accepted given the ones before it were; tau = 1 + sum_j prod_{i<=j} a_i).
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
    def draft_seconds(self, k: int | None = None, batch_size: int = 1) -> float:
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

    def verify_seconds(self, positions: int | float, batch_size: int = 1) -> float:
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

    def decode_seconds(self, batch_size: int = 1) -> float:
        """One plain decode step of the target (the target-only baseline)."""
        d = self.decode
        if d is None:
            return self.verify_seconds(1, batch_size)
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
        return (num_draft_tokens * self.draft_seconds(k, batch_size)
                + self.verify_seconds(num_draft_tokens + 1, batch_size))

    # --- the yield -------------------------------------------------------------------------------------------
    @staticmethod
    def tokens_per_round(num_draft_tokens: int | float, *, acceptance: float | Sequence[float] | None = None,
                         tau: float | None = None) -> float:
        """tau, per sequence: given, or from one i.i.d. acceptance, or from per-position acceptances."""
        if (tau is None) == (acceptance is None):
            raise ValueError("Pass exactly one of tau= (tokens per round) or acceptance= (per-token acceptance).")
        if tau is not None:
            return float(tau)
        if isinstance(acceptance, (int, float)):
            return expected_accepted_length(acceptance, num_draft_tokens)
        per_position = [min(max(float(a), 0.0), 1.0) for a in acceptance]
        if len(per_position) != num_draft_tokens:
            raise ValueError(f"Pass one acceptance per draft position: got {len(per_position)} for L={num_draft_tokens}.")
        total, run = 1.0, 1.0
        for a in per_position:
            run *= a
            total += run
        return total

    def tokens_per_second(self, num_draft_tokens: int | float | Mapping[int, float], *, k: int | None = None, batch_size: int = 1,
                          acceptance: float | Sequence[float] | None = None, tau: float | None = None) -> float:
        """Tokens per second of speculative decoding, summed over the batch."""
        tau = self.tokens_per_round(num_draft_tokens, acceptance=acceptance, tau=tau)
        return batch_size * tau / self.round_seconds(num_draft_tokens, k, batch_size)

    def plain_tokens_per_second(self, batch_size: int = 1) -> float:
        """Tokens per second of target-only decoding, summed over the batch."""
        return batch_size / self.decode_seconds(batch_size)

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
        tau = self.tokens_per_round(num_draft_tokens, acceptance=acceptance, tau=tau)
        s = self.speedup(num_draft_tokens, k=k, batch_size=batch_size, tau=tau)
        if s >= 1 + margin:
            return None
        b = batch_size
        return (f"speculating does not pay at batch size {b}: a round of {num_draft_tokens:g} drafts costs "
                f"{self.round_seconds(num_draft_tokens, k, b) * 1e3:.3g} ms for {tau:.2f} tokens per sequence, "
                f"plain decoding {self.decode_seconds(b) * 1e3:.3g} ms per token (predicted speedup {s:.2f}x)")
