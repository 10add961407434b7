"""Redistributing Drafter Kernels (RDK): a trimmed drafter proposes pruned tokens too, losslessly.

A trimmed drafter's proposal q' lives on the kept vocabulary V', so per-token acceptance is at most the
target's mass on V' (and under greedy a step fails whenever the target's argmax is pruned). RDK proposes
from ``q_RDK = Mᵀ q'`` over the FULL vocabulary instead, where M is a row-stochastic kernel from kept to
full-vocabulary tokens: draw i ~ q', then j ~ M[i]. Verification uses that exact q_RDK (acceptance test
and residual), so the output distribution is exactly the target's for ANY row-stochastic M; M only
decides how much acceptance comes back. Derivation and the estimator: docs/rdk.md.

M is sparse: row i keeps ``weights[i, 0]`` on its own token and ``weights[i, 1:]`` on ``m`` pruned tokens
``targets[i]``, so q_RDK costs O(|V'|·m) per draft position (never O(V²)) and a draw costs O(m).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "RDKKernel",
    "calibration_sequences",
    "embedding_prior_kernel",
    "expected_acceptance",
    "fit_rdk_kernel",
    "identity_kernel",
]


@dataclass
class RDKKernel:
    """Sparse row-stochastic kernel M: kept token ``d2t[i]`` -> itself or one of ``targets[i]``.

    ``weights[:, 0]`` is the mass a row keeps on its own token, ``weights[:, 1:]`` the mass moved to the
    matching ``targets`` (pruned target ids; padding entries carry weight 0).
    """

    d2t: torch.Tensor  # (K,) int64, kept target ids
    targets: torch.Tensor  # (K, m) int64, pruned target ids
    weights: torch.Tensor  # (K, m + 1) float32, rows sum to 1
    vocab_size: int
    method: str = "custom"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.d2t = torch.as_tensor(self.d2t, dtype=torch.long)
        self.targets = torch.as_tensor(self.targets, dtype=torch.long)
        self.weights = torch.as_tensor(self.weights, dtype=torch.float32)
        if self.targets.ndim == 1:
            self.targets = self.targets[:, None]

    @property
    def num_targets(self) -> int:
        return int(self.targets.shape[1])

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    def validate(self) -> RDKKernel:
        """Raise ValueError (naming the fix) unless this is a valid row-stochastic kernel for ``d2t``."""
        k, m = self.draft_vocab_size, self.num_targets
        fix = "Build kernels with hf_vocabspec.rdk (fit_rdk_kernel / embedding_prior_kernel) for this drafter."
        if self.targets.shape != (k, m) or self.weights.shape != (k, m + 1):
            raise ValueError(
                f"RDK kernel shapes do not fit: d2t {tuple(self.d2t.shape)}, targets {tuple(self.targets.shape)}, "
                f"weights {tuple(self.weights.shape)} (expected (K, m) and (K, m+1)). {fix}"
            )
        w = self.weights
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise ValueError(f"RDK kernel weights must be finite and non-negative. {fix}")
        if not torch.allclose(w.sum(1), torch.ones(k), atol=1e-4):
            raise ValueError(f"RDK kernel rows must sum to 1 (row-stochastic). {fix}")
        if bool((self.targets < 0).any()) or bool((self.targets >= self.vocab_size).any()):
            raise ValueError(f"RDK kernel targets must be token ids in [0, {self.vocab_size}). {fix}")
        kept = torch.zeros(self.vocab_size, dtype=torch.bool)
        kept[self.d2t] = True
        if bool((kept[self.targets] & (w[:, 1:] > 0)).any()):
            raise ValueError(f"RDK kernel moves mass onto kept tokens; targets must be pruned tokens. {fix}")
        return self

    def normalized(self) -> RDKKernel:
        """float32 copy with rows renormalised: the one law both drafting and verification use."""
        w = self.weights.float().clamp_min(0)
        w = w / w.sum(1, keepdim=True)
        return RDKKernel(self.d2t, self.targets, w, self.vocab_size, self.method, dict(self.info))

    def to(self, device) -> RDKKernel:
        return RDKKernel(self.d2t.to(device), self.targets.to(device), self.weights.to(device), self.vocab_size,
                         self.method, self.info)

    @property
    def moved_mass(self) -> float:
        """Mean share of a row's mass that goes to pruned tokens (0 = vanilla pruned sampling)."""
        return float(1 - self.weights[:, 0].double().mean())

    # --- the two operations drafting needs -------------------------------------------------------------
    def sample(self, draft_idx: torch.Tensor) -> torch.Tensor:
        """j ~ M[i] for each drawn kept index i (any shape, long); returns target ids of the same shape."""
        rows = self.weights[draft_idx.reshape(-1)]
        pick = torch.multinomial(rows, 1).squeeze(1)  # never picks a zero-weight column
        own = self.d2t[draft_idx.reshape(-1)]
        moved = self.targets[draft_idx.reshape(-1)].gather(1, (pick - 1).clamp_min(0)[:, None]).squeeze(1)
        return torch.where(pick == 0, own, moved).reshape(draft_idx.shape)

    def redistribute(self, q_draft: torch.Tensor) -> torch.Tensor:
        """Exact q_RDK = Mᵀq' over the full vocabulary: (..., K) probabilities -> (..., V)."""
        lead = q_draft.shape[:-1]
        q = q_draft.reshape(-1, q_draft.shape[-1]).float()
        out = q.new_zeros(q.shape[0], self.vocab_size)
        w = self.weights.to(q.device)
        out[:, self.d2t] = q * w[:, 0]
        moved = q[:, :, None] * w[None, :, 1:]  # (N, K, m)
        out.index_add_(1, self.targets.reshape(-1), moved.reshape(q.shape[0], -1))
        return out.reshape(*lead, self.vocab_size)

    def dense(self) -> torch.Tensor:
        """(K, V) dense M; for tests and small vocabularies only."""
        return self.redistribute(torch.eye(self.draft_vocab_size))

    # --- persistence (safetensors; the drafter checkpoint stores the same tensors as buffers) ----------
    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        from .export import _atomic

        meta = {"vocab_size": str(self.vocab_size), "method": self.method, "format": "hf_vocabspec.rdk/1"}
        tensors = {"d2t": self.d2t.contiguous(), "targets": self.targets.contiguous(),
                   "weights": self.weights.contiguous()}
        _atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))

    @classmethod
    def load(cls, path: str | Path) -> RDKKernel:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != "hf_vocabspec.rdk/1":
                raise ValueError(f"{path} is not an hf_vocabspec RDK kernel file (saved with RDKKernel.save).")
            t = {k: f.get_tensor(k) for k in ("d2t", "targets", "weights")}
        return cls(t["d2t"], t["targets"], t["weights"], int(meta["vocab_size"]), meta.get("method", "custom")).validate()


def identity_kernel(d2t: torch.Tensor, vocab_size: int, num_targets: int = 1) -> RDKKernel:
    """M = I on the kept tokens: RDK switched off (vanilla pruned sampling); a baseline and a fallback."""
    d2t = torch.as_tensor(d2t, dtype=torch.long)
    k = d2t.numel()
    pruned = _pruned_ids(d2t, vocab_size)
    filler = pruned[:1] if pruned.numel() else torch.zeros(1, dtype=torch.long)
    weights = torch.zeros(k, num_targets + 1)
    weights[:, 0] = 1
    return RDKKernel(d2t, filler.expand(k, num_targets).clone(), weights, vocab_size, "identity")


def _pruned_ids(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    kept = torch.zeros(vocab_size, dtype=torch.bool)
    kept[d2t] = True
    return (~kept).nonzero().squeeze(1)


# ----------------------------------------------------------------------------------------------------
# Calibration data and the data-fitted kernel
# ----------------------------------------------------------------------------------------------------
def calibration_sequences(dataset, tokenizer, *, max_sequences: int = 64, max_length: int = 256,
                          min_length: int = 16, skip: int = 0) -> list[torch.Tensor]:
    """Token ids of assistant turns (as the chat template renders them) for fitting and scoring kernels."""
    from .coverage import assistant_texts

    out = []
    for i, text in enumerate(assistant_texts(dataset, tokenizer)):
        if i < skip:
            continue
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0][:max_length]
        if ids.numel() >= min_length:
            out.append(ids)
        if len(out) >= max_sequences:
            break
    if not out:
        raise ValueError("No assistant turns long enough for RDK calibration: pass a chat dataset with assistant text.")
    return out


@torch.no_grad()
def _distributions(target, drafter, seq: torch.Tensor, d2t: torch.Tensor, temperature: float):
    """(p over V, q' over K) at every position of one sequence; q' from the drafter or the target proxy."""
    ids = seq[None].to(target.device)
    logits = target(input_ids=ids).logits[0].float() / temperature
    p = logits.softmax(-1)
    if drafter is None:  # target restricted to V' and renormalised: the ideal trimmed drafter
        q = p[:, d2t]
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    else:
        q = _drafter_q(drafter, ids, d2t, temperature)
    return p, q


def _drafter_q(drafter, ids: torch.Tensor, d2t: torch.Tensor, temperature: float) -> torch.Tensor:
    from .drafter import TrimmedDrafter

    if isinstance(drafter, TrimmedDrafter):
        if not torch.equal(drafter.d2t.cpu(), d2t.cpu()):
            raise ValueError("The drafter's kept vocabulary differs from the kernel's d2t: fit on the same drafter.")
        hidden = drafter.model(input_ids=ids.to(drafter.device)).last_hidden_state[0]
        logits = drafter.draft_logits(hidden).float()
    else:
        logits = drafter(input_ids=ids.to(drafter.device)).logits[0].float()[:, d2t]
    return (logits / temperature).softmax(-1).to(ids.device)


def expected_acceptance(p: torch.Tensor, q_full: torch.Tensor) -> torch.Tensor:
    """Per-position probability that one draft token is accepted: sum_j min(p_j, q_j)."""
    return torch.minimum(p, q_full).sum(-1)


def fit_rdk_kernel(
    target,
    d2t: torch.Tensor,
    sequences: Sequence[torch.Tensor],
    *,
    drafter=None,
    num_targets: int = 8,
    top_draft: int = 32,
    top_pruned: int = 64,
    temperature: float = 1.0,
    shrink_grid: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.5),
    holdout: float = 0.25,
    progress: bool = True,
) -> RDKKernel:
    """Fit M from the target's next-token distributions on calibration text (docs/rdk.md).

    Responsibility estimator: at each position the drafter's q'(i) says how much of the proposal kept
    token i is responsible for; M[i, j] for pruned j is the q'-weighted mean of the target's p(j), M[i, i]
    the q'-weighted mean of p(i), both over the q'-weighted mean of p(i) + p(pruned). Only the top
    ``num_targets`` pruned tokens per row are kept (the rest stays on i), then the moved mass is scaled by
    the ``shrink_grid`` value with the highest expected acceptance on held-out sequences.
    """
    from tqdm.auto import tqdm

    d2t = torch.as_tensor(d2t, dtype=torch.long).to(target.device)
    vocab = int(target.config.get_text_config().vocab_size)
    k = d2t.numel()
    if not sequences:
        raise ValueError("fit_rdk_kernel needs calibration sequences (see rdk.calibration_sequences).")
    n_hold = max(1, int(round(len(sequences) * holdout))) if len(sequences) > 1 and holdout > 0 else 0
    fit_seqs, hold_seqs = list(sequences[: len(sequences) - n_hold]), list(sequences[len(sequences) - n_hold :])
    kept_mask = torch.zeros(vocab, dtype=torch.bool, device=d2t.device)
    kept_mask[d2t] = True

    num = torch.zeros(k, dtype=torch.float64)  # sum_t q'(i) (p(i) + p(pruned))
    own = torch.zeros(k, dtype=torch.float64)  # sum_t q'(i) p(i)
    pair_keys, pair_vals = [], []
    co = None  # coalesced sparse (K, V) co-occurrence sum_t q'(i) p(j), j pruned
    positions = 0
    for seq in tqdm(fit_seqs, desc="RDK fit", disable=not progress):
        p, q = _distributions(target, drafter, seq, d2t, temperature)
        p_kept = p[:, d2t]
        p_pruned_total = (1 - p_kept.sum(-1)).clamp_min(0)
        own += (q * p_kept).sum(0).double().cpu()
        num += (q * (p_kept + p_pruned_total[:, None])).sum(0).double().cpu()
        qv, qi = q.topk(min(top_draft, k), dim=-1)
        pv, pj = p.masked_fill(kept_mask, 0).topk(min(top_pruned, vocab - k), dim=-1)
        vals = (qv[:, :, None] * pv[:, None, :]).reshape(-1)
        keys = (qi[:, :, None] * vocab + pj[:, None, :]).reshape(-1)
        pair_keys.append(keys.cpu())
        pair_vals.append(vals.double().cpu())
        positions += p.shape[0]
        if sum(x.numel() for x in pair_keys) > 4_000_000:
            co = _merge(co, pair_keys, pair_vals)
    co = _merge(co, pair_keys, pair_vals)

    rows, cols = co[0] // vocab, co[0] % vocab
    vals = co[1]
    # per row: top-m pruned targets by co-occurrence (sort by value, then stably by row)
    order = vals.argsort(descending=True)
    order = order[rows[order].argsort(stable=True)]
    rows, cols, vals = rows[order], cols[order], vals[order]
    starts = torch.zeros(k + 1, dtype=torch.long)
    starts[1:] = torch.bincount(rows, minlength=k).cumsum(0)
    rank = torch.arange(rows.numel()) - starts[rows]
    keep = rank < num_targets
    rows, cols, vals, rank = rows[keep], cols[keep], vals[keep], rank[keep]

    pruned = _pruned_ids(d2t.cpu(), vocab)
    targets = pruned[:1].expand(k, num_targets).clone() if pruned.numel() else torch.zeros(k, num_targets, dtype=torch.long)
    moved = torch.zeros(k, num_targets, dtype=torch.float64)
    targets[rows, rank] = cols
    moved[rows, rank] = vals / num[rows].clamp_min(1e-30)
    moved[num < 1e-12] = 0  # rows never proposed in calibration: stay identity
    moved = moved.clamp_max(1)
    scale = moved.sum(1).clamp_min(1.0)  # a row can never move more than all of its mass
    moved = moved / scale[:, None]

    def build(lam: float) -> RDKKernel:
        w = torch.zeros(k, num_targets + 1, dtype=torch.float64)
        w[:, 1:] = lam * moved
        w[:, 1:] /= w[:, 1:].sum(1, keepdim=True).clamp_min(1.0)[:, :]  # never more than the whole row
        w[:, 0] = 1 - w[:, 1:].sum(1)
        return RDKKernel(d2t.cpu(), targets, w.float(), vocab, "fitted").normalized()

    candidates = {float(lam): build(float(lam)) for lam in shrink_grid}
    if hold_seqs:
        scores = score_kernels(target, hold_seqs, {str(lam): kern for lam, kern in candidates.items()},
                               drafter=drafter, temperature=temperature, progress=progress)
        best = max(candidates, key=lambda lam: scores[str(lam)])
    else:
        scores, best = {}, max(shrink_grid)
    kernel = candidates[best]
    kernel.info = {
        "method": "fitted",
        "num_targets": num_targets,
        "shrink": best,
        "temperature": temperature,
        "fit_positions": positions,
        "fit_sequences": len(fit_seqs),
        "holdout_sequences": len(hold_seqs),
        "holdout_acceptance_by_shrink": scores,
        "q_source": "drafter" if drafter is not None else "target restricted to kept vocabulary",
    }
    return kernel.validate()


def _merge(co, keys: list, vals: list):
    """Coalesce (key, value) pairs into unique keys with summed values; clears the input lists."""
    if co is not None:
        keys.append(co[0])
        vals.append(co[1])
    all_keys, all_vals = torch.cat(keys), torch.cat(vals)
    keys.clear()
    vals.clear()
    uniq, inverse = torch.unique(all_keys, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, all_vals)
    return uniq, summed


# ----------------------------------------------------------------------------------------------------
# The data-free fallback prior
# ----------------------------------------------------------------------------------------------------
@torch.no_grad()
def embedding_prior_kernel(
    embeddings: torch.Tensor,
    d2t: torch.Tensor,
    *,
    pruned_mass: float,
    num_targets: int = 8,
    temperature: float = 0.05,
    chunk: int = 4096,
    progress: bool = True,
) -> RDKKernel:
    """Data-free kernel: row i moves ``pruned_mass`` to its ``num_targets`` most cosine-similar pruned tokens.

    ``embeddings`` is a (V, h) token embedding table (e.g. the drafter's input embeddings);
    ``pruned_mass`` is how much a kept token should give away, e.g. 1 - coverage of the kept vocabulary
    on the workload (what a perfect trimmed drafter over-proposes on average). Weights among the targets
    are softmax(cosine / temperature).
    """
    from tqdm.auto import tqdm

    if not 0 <= pruned_mass < 1:
        raise ValueError(f"pruned_mass must be in [0, 1), got {pruned_mass}: use 1 - coverage of the kept vocabulary.")
    d2t = torch.as_tensor(d2t, dtype=torch.long).cpu()
    emb = embeddings.detach().float().cpu()
    vocab, k = emb.shape[0], d2t.numel()
    pruned = _pruned_ids(d2t, vocab)
    if pruned.numel() == 0:
        return identity_kernel(d2t, vocab, num_targets)
    m = min(num_targets, pruned.numel())
    unit = emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-12)
    pruned_unit = unit[pruned]
    targets = torch.empty(k, m, dtype=torch.long)
    sims = torch.empty(k, m)
    for start in tqdm(range(0, k, chunk), desc="RDK prior", disable=not progress):
        block = unit[d2t[start : start + chunk]] @ pruned_unit.T
        v, j = block.topk(m, dim=1)
        sims[start : start + chunk], targets[start : start + chunk] = v, pruned[j]
    w = torch.zeros(k, m + 1)
    w[:, 1:] = pruned_mass * (sims / temperature).softmax(1)
    w[:, 0] = 1 - pruned_mass
    if m < num_targets:  # pad to the requested width with zero-weight columns
        pad = num_targets - m
        targets = torch.cat([targets, targets[:, :1].expand(k, pad)], 1)
        w = torch.cat([w, torch.zeros(k, pad)], 1)
    kernel = RDKKernel(d2t, targets, w, vocab, "prior").normalized()
    kernel.info = {"method": "prior", "num_targets": num_targets, "pruned_mass": pruned_mass,
                   "temperature": temperature, "similarity": "cosine of token embeddings"}
    return kernel.validate()


# ----------------------------------------------------------------------------------------------------
# Comparing kernels without generating: expected one-token acceptance on held-out text
# ----------------------------------------------------------------------------------------------------
@torch.no_grad()
def score_kernels(
    target,
    sequences: Iterable[torch.Tensor],
    kernels: dict[str, RDKKernel],
    *,
    drafter=None,
    temperature: float = 1.0,
    progress: bool = True,
) -> dict[str, float]:
    """Mean expected acceptance sum_j min(p_j, q_RDK_j) of each kernel over all positions of ``sequences``.

    All kernels must share one ``d2t``. Cheap and noise-free; end-to-end tau comes from the benchmark.
    """
    from tqdm.auto import tqdm

    if not kernels:
        return {}
    first = next(iter(kernels.values()))
    d2t = first.d2t.to(target.device)
    totals = dict.fromkeys(kernels, 0.0)
    n = 0
    for seq in tqdm(list(sequences), desc="RDK score", disable=not progress):
        p, q = _distributions(target, drafter, seq, d2t, temperature)
        for name, kern in kernels.items():
            if not torch.equal(kern.d2t.to(d2t.device), d2t):
                raise ValueError("score_kernels: all kernels must be built for the same kept vocabulary (d2t).")
            totals[name] += float(expected_acceptance(p, kern.to(p.device).redistribute(q)).sum())
        n += p.shape[0]
    return {name: total / max(n, 1) for name, total in totals.items()}


def iter_pruning_levels(levels: Iterable[float], vocab_size: int) -> Iterator[tuple[float, int]]:
    """(pruned fraction, kept size) pairs, e.g. 0.9 of 262,144 -> 26,214 kept."""
    for level in levels:
        if not 0 <= level < 1:
            raise ValueError(f"pruning level must be in [0, 1), got {level}")
        yield level, max(1, int(math.floor(vocab_size * (1 - level))))
