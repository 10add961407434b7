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

from ._io import atomic_write

__all__ = [
    "CalibrationData",
    "RDKKernel",
    "calibration_sequences",
    "collect_calibration",
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

        from ._io import tensors_checksum

        meta = {"vocab_size": str(self.vocab_size), "method": self.method, "format": "hf_vocabspec.rdk/1"}
        tensors = {"d2t": self.d2t.contiguous(), "targets": self.targets.contiguous(),
                   "weights": self.weights.contiguous()}
        meta["sha256"] = tensors_checksum(tensors, meta)
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))

    @classmethod
    def load(cls, path: str | Path) -> RDKKernel:
        """A kernel saved by :meth:`save`; a cut, edited or corrupt file is refused in one line (never loaded
        as another kernel: the file carries a checksum over its tensors and metadata)."""
        from ._io import read_safetensors, tensors_checksum

        fix = "fit it again (hf_vocabspec.rdk.fit_rdk_kernel) and save it with RDKKernel.save"
        t, meta = read_safetensors(path, "RDK kernel file", fix)
        if meta.get("format") != "hf_vocabspec.rdk/1" or set(t) != {"d2t", "targets", "weights"}:
            raise ValueError(f"{path} is not an hf_vocabspec RDK kernel file (saved with RDKKernel.save).")
        if "sha256" in meta and tensors_checksum(t, meta) != meta["sha256"]:
            raise ValueError(f"{path} does not match its checksum (edited or corrupt): {fix}.")
        kinds = {"d2t": (torch.int64, 1), "targets": (torch.int64, 2), "weights": (torch.float32, 2)}
        for name, (dtype, ndim) in kinds.items():
            if t[name].dtype != dtype or t[name].ndim != ndim:
                raise ValueError(f"{path}: `{name}` must be a {ndim}-D {dtype} tensor, got {t[name].dtype} "
                                 f"{tuple(t[name].shape)}: {fix}.")
        try:
            vocab_size = int(meta["vocab_size"])
        except (KeyError, ValueError):
            raise ValueError(f"{path}: metadata vocab_size missing or not an integer: {fix}.") from None
        d2t = t["d2t"]
        if d2t.numel() == 0 or bool((d2t < 0).any()) or bool((d2t >= vocab_size).any()) or (
                d2t.numel() > 1 and not bool((d2t[1:] > d2t[:-1]).all())):
            raise ValueError(f"{path}: `d2t` must hold strictly increasing ids in [0, {vocab_size}): {fix}.")
        return cls(d2t, t["targets"], t["weights"], vocab_size, meta.get("method", "custom")).validate()


def drafter_kernel(drafter) -> RDKKernel | None:
    """The kernel attached to a :class:`~hf_vocabspec.modeling.TrimmedDrafter` as float32, rows renormalised
    (None without one): the one law both drafting and verification use."""
    if not drafter.config.rdk or getattr(drafter, "rdk_weights", None) is None:
        return None
    drafter.validate_rdk_buffers()
    return RDKKernel(drafter.d2t, drafter.rdk_targets, drafter.rdk_weights.float(), drafter.config.vocab_size,
                     drafter.config.rdk.get("method", "custom"), dict(drafter.config.rdk)).normalized()


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


def _drafter_q(drafter, ids: torch.Tensor, d2t: torch.Tensor, temperature: float) -> torch.Tensor:
    from .modeling import TrimmedDrafter

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


@dataclass
class CalibrationData:
    """The target's next-token distributions on calibration text, kept sparse: top ``R`` (id, p) per position.

    Collected once and reused for every kept vocabulary (one target pass serves all pruning levels).
    """

    top_ids: torch.Tensor  # (N, R) int64, descending probability
    top_p: torch.Tensor  # (N, R) float32
    vocab_size: int
    temperature: float = 1.0
    num_sequences: int = 0

    @property
    def num_positions(self) -> int:
        return int(self.top_ids.shape[0])

    def split(self, holdout: float) -> tuple[CalibrationData, CalibrationData]:
        n_hold = int(round(self.num_positions * holdout))
        cut = self.num_positions - n_hold
        mk = lambda sl: CalibrationData(self.top_ids[sl], self.top_p[sl], self.vocab_size, self.temperature)  # noqa: E731
        return mk(slice(0, cut)), mk(slice(cut, None))


@torch.no_grad()
def collect_calibration(target, sequences: Sequence[torch.Tensor], *, top: int = 256, temperature: float = 1.0,
                        progress: bool = True) -> CalibrationData:
    """One target forward per sequence; keep each position's top-``top`` tokens (the mass RDK can use)."""
    from tqdm.auto import tqdm

    if not sequences:
        raise ValueError("RDK calibration needs token sequences (see rdk.calibration_sequences).")
    ids, probs = [], []
    for seq in tqdm(list(sequences), desc="RDK calibration", disable=not progress):
        logits = target(input_ids=seq[None].to(target.device)).logits[0].float() / temperature
        v, i = logits.softmax(-1).topk(min(top, logits.shape[-1]), dim=-1)  # a vocabulary under top: all of it
        ids.append(i.cpu())
        probs.append(v.cpu())
    vocab = int(target.config.get_text_config().vocab_size)
    return CalibrationData(torch.cat(ids), torch.cat(probs), vocab, temperature, len(sequences))


def _position_summaries(calib: CalibrationData, d2t: torch.Tensor, top_draft: int, top_pruned: int):
    """Per position: proxy q' (target restricted to kept tokens, renormalised) top-s, and the pruned top-r."""
    kept_mask = torch.zeros(calib.vocab_size, dtype=torch.bool)
    kept_mask[d2t] = True
    t2d = torch.full((calib.vocab_size,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(d2t.numel())
    is_kept = kept_mask[calib.top_ids]
    coverage = (calib.top_p * is_kept).sum(1)
    ok = coverage > 1e-6  # positions whose visible mass is all pruned give q' no meaning: skipped
    top_ids, top_p, is_kept, coverage = calib.top_ids[ok], calib.top_p[ok], is_kept[ok], coverage[ok]
    s = min(top_draft, top_p.shape[1])
    kv, ka = top_p.masked_fill(~is_kept, -1.0).topk(s, dim=1)
    kvalid = kv > 0
    p_kept = kv.clamp_min(0)
    qv = p_kept / coverage[:, None]
    qi = torch.where(kvalid, t2d[top_ids.gather(1, ka)], 0)
    r = min(top_pruned, top_p.shape[1])
    pv, pa = top_p.masked_fill(is_kept, -1.0).topk(r, dim=1)
    pvalid = pv > 0
    return {"qi": qi, "qv": qv * kvalid, "p_kept": p_kept, "pj": top_ids.gather(1, pa), "pv": pv.clamp_min(0) * pvalid,
            "positions": int(ok.sum())}


def _candidate_targets(summ: dict, k: int, vocab: int, num_targets: int, d2t: torch.Tensor, min_support: float):
    """Per kept row, the ``num_targets`` pruned tokens with the largest co-occurrence sum_t q'(i) p(j).

    Pairs whose co-occurrence is below ``min_support`` (in positions' worth of probability mass) are not
    eligible: rare pairs are noise that the fit would chase (measured: it overfits without this).
    """
    qi, qv, pj, pv = summ["qi"], summ["qv"], summ["pj"], summ["pv"]
    vals = (qv[:, :, None] * pv[:, None, :]).reshape(-1).double()
    keys = (qi[:, :, None] * vocab + pj[:, None, :]).reshape(-1)
    nz = vals > 0
    keys, vals = _coalesce(keys[nz], vals[nz])
    strong = vals >= min_support
    keys, vals = keys[strong], vals[strong]
    rows, cols = keys // vocab, keys % vocab
    order = vals.argsort(descending=True)
    order = order[rows[order].argsort(stable=True)]
    rows, cols = rows[order], cols[order]
    starts = torch.zeros(k + 1, dtype=torch.long)
    starts[1:] = torch.bincount(rows, minlength=k).cumsum(0)
    rank = torch.arange(rows.numel()) - starts[rows]
    keep = rank < num_targets
    pruned = _pruned_ids(d2t, vocab)
    filler = int(pruned[0]) if pruned.numel() else 0
    targets = torch.full((k, num_targets), filler, dtype=torch.long)
    has = torch.zeros(k, num_targets, dtype=torch.bool)
    targets[rows[keep], rank[keep]] = cols[keep]
    has[rows[keep], rank[keep]] = True
    return targets, has


class _AcceptanceObjective:
    """Expected acceptance F(M) = sum_t sum_j min(p_t(j), (Mᵀq'_t)(j)) on calibration positions, sparse.

    F is concave in M (a sum of minima of linear functions), so projected supergradient ascent over the
    row simplices finds its maximum on the chosen support.
    """

    def __init__(self, summ: dict, targets: torch.Tensor, vocab: int):
        qi, qv, pj, pv = summ["qi"], summ["qv"], summ["pj"], summ["pv"]
        n, s = qi.shape
        m = targets.shape[1]
        self.n = max(summ["positions"], 1)
        self.qi, self.qv, self.p_kept = qi, qv, summ["p_kept"]
        # entries (t, a, b): kept row qi[t, a] moving to its slot b, target id targets[qi[t, a], b]
        cand = targets[qi]  # (n, s, m)
        t_idx = torch.arange(n)[:, None, None].expand(n, s, m)
        keys = (t_idx * vocab + cand).reshape(-1)
        uniq, self.group = torch.unique(keys, return_inverse=True)
        # p_t(j) for each (t, j) group: look it up in the position's pruned top-r
        g_t, g_j = uniq // vocab, uniq % vocab
        match = pj[g_t] == g_j[:, None]
        self.p_group = (pv[g_t] * match).sum(1)
        self.entry_q = qv[:, :, None].expand(n, s, m).reshape(-1)
        self.entry_row = qi[:, :, None].expand(n, s, m).reshape(-1)
        self.entry_slot = torch.arange(m)[None, None, :].expand(n, s, m).reshape(-1)
        self.row_mass = torch.zeros(targets.shape[0]).index_add_(0, qi.reshape(-1), qv.reshape(-1))

    def value_and_grad(self, w: torch.Tensor) -> tuple[float, torch.Tensor]:
        own = self.qv * w[self.qi, 0]
        value = torch.minimum(own, self.p_kept).sum()
        grad = torch.zeros_like(w)
        grad[:, 0].index_add_(0, self.qi.reshape(-1), (self.qv * (own < self.p_kept)).reshape(-1))
        contrib = self.entry_q * w[self.entry_row, 1 + self.entry_slot]
        r = torch.zeros_like(self.p_group).index_add_(0, self.group, contrib)
        value = value + torch.minimum(r, self.p_group).sum()
        short = (r < self.p_group)[self.group]
        g = torch.zeros(w.shape[0] * (w.shape[1] - 1))
        g.index_add_(0, self.entry_row * (w.shape[1] - 1) + self.entry_slot, self.entry_q * short)
        grad[:, 1:] = g.view(w.shape[0], -1)
        return float(value) / self.n, grad


def _project_rows_to_simplex(w: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row onto {w >= 0, sum w = 1, w = 0 outside ``allowed``}."""
    w = w.masked_fill(~allowed, -1e9)
    u = w.sort(dim=1, descending=True).values
    css = u.cumsum(1) - 1
    ks = torch.arange(1, w.shape[1] + 1, dtype=w.dtype)
    cond = (u - css / ks) > 0
    rho = cond.cumsum(1).argmax(1, keepdim=True)  # last index where cond holds
    theta = css.gather(1, rho) / (rho + 1).to(w.dtype)
    return (w - theta).clamp_min(0) * allowed


def fit_rdk_kernel(
    calib: CalibrationData,
    d2t: torch.Tensor,
    *,
    num_targets: int = 8,
    top_draft: int = 32,
    top_pruned: int = 64,
    steps: int = 150,
    min_support: float = 3.0,
    holdout: float = 0.2,
    shrink_grid: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
) -> RDKKernel:
    """Fit M to MAXIMISE expected acceptance of q_RDK on calibration positions (docs/rdk.md).

    q' is the ideal trimmed drafter (the target restricted to the kept vocabulary), so one calibration
    pass serves every kept vocabulary. Support: each row's ``num_targets`` pruned tokens with the largest
    co-occurrence sum_t q'(i) p(j). Weights: projected supergradient ascent on the concave objective,
    then the moved mass is scaled by the ``shrink_grid`` value (0 = vanilla) that does best on held-out
    positions, so the fitted kernel never scores below vanilla pruned sampling there.
    """
    d2t = torch.as_tensor(d2t, dtype=torch.long).cpu()
    k, vocab = d2t.numel(), calib.vocab_size
    if _pruned_ids(d2t, vocab).numel() == 0:
        return identity_kernel(d2t, vocab, num_targets)
    train, held = calib.split(holdout) if holdout > 0 else (calib, None)
    summ = _position_summaries(train, d2t, top_draft, top_pruned)
    targets, allowed_t = _candidate_targets(summ, k, vocab, num_targets, d2t, min_support)
    allowed = torch.cat([torch.ones(k, 1, dtype=torch.bool), allowed_t], 1)
    objective = _AcceptanceObjective(summ, targets, vocab)
    w = torch.zeros(k, num_targets + 1)
    w[:, 0] = 1
    best_value = objective.value_and_grad(w)[0]
    vanilla_value, best_w = best_value, w.clone()
    scale = objective.row_mass.clamp_min(1e-9)[:, None]
    for step in range(steps):
        value, grad = objective.value_and_grad(w)
        if value > best_value:
            best_value, best_w = value, w.clone()
        w = _project_rows_to_simplex(w + (0.2 / (1 + step) ** 0.5) * grad / scale, allowed)
    w = best_w
    w[objective.row_mass < 1e-9] = torch.eye(1, num_targets + 1)  # rows never proposed: identity

    def build(lam: float) -> RDKKernel:
        out = w.clone()
        out[:, 1:] *= lam
        out[:, 0] = 1 - out[:, 1:].sum(1)
        return RDKKernel(d2t, targets, out, vocab, "fitted").normalized()

    candidates = {float(lam): build(float(lam)) for lam in shrink_grid}
    held_scores = {}
    if held is not None and held.num_positions:
        held_summ = _position_summaries(held, d2t, top_draft, top_pruned)
        held_obj = _AcceptanceObjective(held_summ, targets, vocab)
        held_scores = {str(lam): held_obj.value_and_grad(c.weights)[0] for lam, c in candidates.items()}
        best = max(candidates, key=lambda lam: (held_scores[str(lam)], -lam))
    else:
        best = max(shrink_grid)
    kernel = candidates[best]
    kernel.info = {
        "method": "fitted",
        "objective": "expected acceptance on calibration positions",
        "num_targets": num_targets,
        "min_support": min_support,
        "rows_with_targets": int(allowed_t.any(1).sum()),
        "shrink": best,
        "temperature": calib.temperature,
        "fit_positions": summ["positions"],
        "train_acceptance_vanilla": round(vanilla_value, 6),
        "train_acceptance_fitted": round(best_value, 6),
        "holdout_acceptance_by_shrink": {key: round(v, 6) for key, v in held_scores.items()},
        "q_source": "target restricted to the kept vocabulary",
    }
    return kernel.validate()


def _coalesce(keys: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique keys with their values summed (sparse co-occurrence accumulation)."""
    uniq, inverse = torch.unique(keys, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, vals)
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
    candidate_ids: torch.Tensor | None = None,
    chunk: int = 4096,
    progress: bool = True,
) -> RDKKernel:
    """Data-free kernel: row i moves ``pruned_mass`` to its ``num_targets`` most cosine-similar pruned tokens.

    ``embeddings`` is a (V, h) token embedding table (e.g. the drafter's input embeddings);
    ``pruned_mass`` is how much a kept token should give away, e.g. 1 - coverage of the kept vocabulary
    on the workload (what a perfect trimmed drafter over-proposes on average). Weights among the targets
    are softmax(cosine / temperature). ``candidate_ids`` restricts the targets (e.g. tokens that occur in
    the workload at all: pruned tokens never seen in the counted text are poor targets, and skipping them
    makes the similarity search cheap).
    """
    from tqdm.auto import tqdm

    if not 0 <= pruned_mass < 1:
        raise ValueError(f"pruned_mass must be in [0, 1), got {pruned_mass}: use 1 - coverage of the kept vocabulary.")
    d2t = torch.as_tensor(d2t, dtype=torch.long).cpu()
    emb = embeddings.detach().float().cpu()
    vocab, k = emb.shape[0], d2t.numel()
    pruned = _pruned_ids(d2t, vocab)
    if candidate_ids is not None:
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[torch.as_tensor(candidate_ids, dtype=torch.long)] = True
        pruned = pruned[allowed[pruned]]
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

    Exact (full-vocabulary p from one target pass per sequence). q' is the given drafter's (all kernels
    must then share its kept vocabulary) or, without one, the ideal trimmed drafter (target restricted to
    each kernel's kept vocabulary, so kernels for different vocabularies are scored in one pass).
    Cheap and noise-free; end-to-end tau comes from generation.
    """
    from tqdm.auto import tqdm

    if not kernels:
        return {}
    totals = dict.fromkeys(kernels, 0.0)
    n = 0
    for seq in tqdm(list(sequences), desc="RDK score", disable=not progress):
        ids = seq[None].to(target.device)
        p = (target(input_ids=ids).logits[0].float() / temperature).softmax(-1)
        q_cache: dict[int, torch.Tensor] = {}
        for name, kern in kernels.items():
            d2t = kern.d2t.to(p.device)
            key = id(kern.d2t)
            if key not in q_cache:
                if drafter is None:
                    q = p[:, d2t]
                    q_cache[key] = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
                else:
                    q_cache[key] = _drafter_q(drafter, ids, d2t, temperature)
            totals[name] += float(expected_acceptance(p, kern.to(p.device).redistribute(q_cache[key])).sum())
        n += p.shape[0]
    return {name: total / max(n, 1) for name, total in totals.items()}


def iter_pruning_levels(levels: Iterable[float], vocab_size: int) -> Iterator[tuple[float, int]]:
    """(pruned fraction, kept size) pairs, e.g. 0.9 of 262,144 -> 26,214 kept."""
    for level in levels:
        if not 0 <= level < 1:
            raise ValueError(f"pruning level must be in [0, 1), got {level}")
        yield level, max(1, int(math.floor(vocab_size * (1 - level))))
